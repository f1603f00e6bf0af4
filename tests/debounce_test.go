package tests

// Debounce end to end: a burst of 1,000 debounced publishes of one key
// in 2 s, with a `leasepool worker` process running the kind, runs the
// task once, with the last payload, on the embedded store and on the
// MongoDB wire test server.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func TestDebounceBurstRunsOnce(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	st, url := flowStore(t, ctx)
	debounceBurst(t, ctx, st, url)
}

func TestMongoDebounceBurstRunsOnce(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	uri := sharedMongoDB(t)
	st := openMongoStore(t, ctx, uri, nil)
	debounceBurst(t, ctx, st, uri)
}

// debounceBurst publishes 1,000 exec tasks of one key, each appending
// its own number to a log, one every 2 ms with a 500 ms debounce, while
// a worker runs exec tasks: the log must end up holding the last
// number alone.
func debounceBurst(t *testing.T, ctx context.Context, st task.Store, storeURL string) {
	const (
		n        = 1000
		burst    = 2 * time.Second
		debounce = 500 * time.Millisecond
		key      = "sensor-7"
	)
	startWorker(t, storeURL, "w1", "--concurrency", "4", "--kinds", "exec")
	logPath := filepath.Join(t.TempDir(), "runs.log")
	payload := func(i int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"argv":["sh","-c",%q]}`, fmt.Sprintf("echo %d >> %s", i, logPath)))
	}
	began := time.Now()
	var lastAt time.Time
	var maxGap time.Duration
	pace := time.NewTicker(burst / n) // the burst's pace: n publishes in burst
	defer pace.Stop()
	for i := range n {
		if i > 0 {
			<-pace.C
		}
		_, res, err := task.Publish(ctx, st, task.PublishParams{Key: key, Kind: "exec", Payload: payload(i), Debounce: debounce})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		now := time.Now()
		gap := time.Duration(0)
		if !lastAt.IsZero() {
			gap = now.Sub(lastAt)
			maxGap = max(maxGap, gap)
		}
		lastAt = now
		want := task.Debounced
		if i == 0 {
			want = task.Inserted
		}
		if res != want {
			// A publish that took longer than the debounce lets the task
			// run mid-burst, as it should: say so, apart from a bug.
			t.Fatalf("publish %d after %s: %s; want %s (this publish came %s after the previous one: above the %s debounce, the machine stalled the burst)",
				i, time.Since(began), res, want, gap, debounce)
		}
	}
	t.Logf("%d publishes in %s, longest gap %s", n, time.Since(began), maxGap)
	var done *task.Task
	eventually(t, 30*time.Second, "the task succeeded", func() bool {
		tk, err := st.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		done = tk
		return tk.State.Finished()
	})
	if done.State != task.StateSucceeded || done.AttemptsStarted != 1 {
		t.Fatalf("task %s after %d attempts; want succeeded after 1", done.State, done.AttemptsStarted)
	}
	// Store time against this process's: the store's clock estimate may
	// be off by a round trip on a loaded machine.
	if started := done.Attempts[0].StartedAt; started.Before(lastAt.Add(debounce - 250*time.Millisecond)) {
		t.Errorf("the attempt started at %s, before the last publish (%s) + the debounce", started, lastAt)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); len(got) != 1 || got[0] != fmt.Sprint(n-1) {
		t.Fatalf("the handler ran with payloads %v; want once, with the last (%d)", got, n-1)
	}
}
