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
// number alone. A burst the machine stalled for longer than the
// debounce lets the task run mid-burst, as it should: that burst proves
// nothing, and another key is tried, three at most.
func debounceBurst(t *testing.T, ctx context.Context, st task.Store, storeURL string) {
	startWorker(t, storeURL, "w1", "--concurrency", "4", "--kinds", "exec")
	for try := 1; ; try++ {
		stalled := debounceBurstOf(t, ctx, st, fmt.Sprintf("sensor-%d", try))
		if stalled == "" {
			return
		}
		if try == 3 {
			t.Fatalf("every burst stalled; the last: %s", stalled)
		}
		t.Logf("burst %d stalled (%s): another key", try, stalled)
	}
}

// debounceBurstOf runs one burst of debounceBurst on key; it returns why
// the burst stalled, or "" once it has checked the outcome.
func debounceBurstOf(t *testing.T, ctx context.Context, st task.Store, key string) (stalled string) {
	const (
		n        = 1000
		burst    = 2 * time.Second
		debounce = 500 * time.Millisecond
	)
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
		if res != want && gap > debounce {
			return fmt.Sprintf("publish %d after %s came %s after the previous one, above the %s debounce: %s", i, time.Since(began), gap, debounce, res)
		}
		if res != want {
			t.Fatalf("publish %d after %s: %s; want %s (%s after the previous one)", i, time.Since(began), res, want, gap)
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
	return ""
}
