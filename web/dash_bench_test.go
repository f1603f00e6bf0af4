package web_test

// Page costs on a large SQLite store:
//
//	LEASEPOOL_DASH_BENCH_TASKS=100000 go test -run '^$' -bench Dashboard -benchtime 20x ./web/
//
// The store is filled once per run (tasks in every state, finished ones
// spread over two hours) in a temporary directory.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

func BenchmarkDashboard(b *testing.B) {
	n := 20_000
	if s := os.Getenv("LEASEPOOL_DASH_BENCH_TASKS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("LEASEPOOL_DASH_BENCH_TASKS: %v", err)
		}
		n = v
	}
	s := tempStore(b)
	fill(b, s, n)
	h, err := web.NewHandler(web.Config{Store: s})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, path := range []string{"/", "/tasks", "/tasks?state=failed", "/tasks?kind=k3&prefix=t-0001",
		"/tasks?text=needle", "/tasks?before=" + strconv.Itoa(n/2), "/workers"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(srv.URL + path)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("GET %s = %d", path, resp.StatusCode)
				}
			}
		})
	}
}

// fill inserts n tasks in every state, of 8 kinds, finished ones updated
// over the last two hours; one in 1000 has "needle" in its payload.
func fill(b *testing.B, s task.Store, n int) {
	b.Helper()
	now := s.Now()
	states := []task.State{task.StatePending, task.StateRunning, task.StateSucceeded, task.StateSucceeded,
		task.StateSucceeded, task.StateFailed, task.StateCancelled}
	for i := range n {
		payload := fmt.Sprintf(`{"i":%d}`, i)
		if i%1000 == 0 {
			payload = fmt.Sprintf(`{"i":%d,"tag":"needle"}`, i)
		}
		t, err := task.NewTask(task.PublishParams{Key: fmt.Sprintf("t-%07d", i), Kind: fmt.Sprintf("k%d", i%8),
			Payload: []byte(payload)}, now)
		if err != nil {
			b.Fatal(err)
		}
		t.State = states[i%len(states)]
		t.UpdatedAt = now.Add(-time.Duration(i%7200) * time.Second)
		if _, _, err := s.Insert(context.Background(), t); err != nil {
			b.Fatal(err)
		}
	}
}
