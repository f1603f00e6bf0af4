package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// BenchmarkRemoteWorkers measures one remote worker process per client
// package at concurrency 32 through `leasepool serve` (built without the
// race detector) over an embedded store on disk: the tasks/s of draining
// 20,000 noop-handler tasks published beforehand, then the publish→start
// latency of 1,000 tasks published one by one at 200/s to the idle
// worker (p50, p99, from the stored claim times). It prints the figures:
//
//	go test ./tests -run '^$' -bench RemoteWorkers -benchtime 1x
func BenchmarkRemoteWorkers(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "leasepool")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/leasepool").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	for _, lang := range []string{"ts", "py"} {
		for range b.N {
			benchRemoteWorker(b, bin, lang)
		}
	}
}

func benchRemoteWorker(b *testing.B, bin, lang string) {
	const tasks, concurrency, latencyTasks = 20000, 32, 1000
	dir := b.TempDir()
	storeURL := "sqlite:" + filepath.Join(dir, "s.db")
	addr := freeAddr(b)
	serve := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "serve", "--listen", addr)
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	url := "http://" + addr
	testutil.EventuallyEvery(b, 30*time.Second, 20*time.Millisecond, "serve to answer", func() bool {
		code, err := httpGet(url + "/api/v1/stats")
		return err == nil && code == 200
	})
	post := func(path string, body any) {
		bb, _ := json.Marshal(body)
		resp, err := http.Post(url+path, "application/json", bytes.NewReader(bb))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			b.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	for n := 0; n < tasks; n += 10000 {
		var ts []map[string]any
		for i := n; i < n+10000 && i < tasks; i++ {
			ts = append(ts, map[string]any{"key": fmt.Sprintf("d%05d", i), "kind": "noop"})
		}
		post("/api/v1/tasks/batch", map[string]any{"tasks": ts})
	}
	st, err := store.Open(b.Context(), storeURL, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	succeeded := func() int64 {
		s, err := st.Stats(b.Context())
		if err != nil {
			return -1
		}
		return s.ByState()[task.StateSucceeded]
	}

	began := time.Now()
	w := startBenchWorker(b, lang, url, concurrency)
	defer func() { w.Process.Kill(); w.Wait() }()
	testutil.EventuallyEvery(b, 10*time.Minute, 50*time.Millisecond, "the backlog to drain", func() bool { return succeeded() == tasks })
	drain := time.Since(began)

	// Latency: tasks published one at a time to the idle worker.
	tick := time.NewTicker(5 * time.Millisecond)
	for i := range latencyTasks {
		<-tick.C
		post("/api/v1/tasks", map[string]any{"key": fmt.Sprintf("l%04d", i), "kind": "noop"})
	}
	tick.Stop()
	testutil.EventuallyEvery(b, time.Minute, 50*time.Millisecond, "the latency tasks to finish", func() bool { return succeeded() == tasks+latencyTasks })
	var lat []time.Duration
	for i := range latencyTasks {
		doc, err := st.Get(b.Context(), fmt.Sprintf("l%04d", i))
		if err != nil || len(doc.Workers) == 0 {
			b.Fatalf("l%04d: %v", i, err)
		}
		lat = append(lat, doc.Workers[0].StartedAt.Sub(doc.CreatedAt))
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))].Round(100 * time.Microsecond) }
	// The start counted from the worker process's start: it includes
	// Node's or Python's start-up, a few hundred ms at most.
	fmt.Printf("remote worker %s, concurrency %d: %d noop tasks drained in %s, %.0f tasks/s; publish→claim p50 %s, p99 %s (%d tasks at 200/s)\n",
		lang, concurrency, tasks, drain.Round(time.Millisecond), tasks/drain.Seconds(), p(0.50), p(0.99), latencyTasks)
	b.ReportMetric(tasks/drain.Seconds(), lang+"-tasks/s")
}

// startBenchWorker starts lang's record-worker recording to /dev/null: its
// handler returns at once.
func startBenchWorker(b *testing.B, lang, url string, concurrency int) *exec.Cmd {
	args := []string{"--url", url, "--id", "bench-" + lang, "--kinds", "noop", "--concurrency", fmt.Sprint(concurrency), "--record", os.DevNull}
	var cmd *exec.Cmd
	if lang == "ts" {
		cmd = exec.Command("node", append([]string{filepath.Join(clientDir("typescript"), "examples", "record-worker.js")}, args...)...)
	} else {
		cmd = exec.Command("python3", append([]string{filepath.Join(clientDir("python"), "examples", "record_worker.py")}, args...)...)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}
