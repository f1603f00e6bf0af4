package tests

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// TestLockLineOrderAcrossProcesses: tasks waiting for one lock key on three
// worker processes take it in priority, then publish order (a line kept in
// the store), never two at once. Before the line, each worker served its
// own waiters first, and the first to see a release won.
func TestLockLineOrderAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	st, url := flowStore(t, ctx)
	const lockKey, n = "device:pump-7", 12
	release := filepath.Join(t.TempDir(), "release")
	runLog := filepath.Join(t.TempDir(), "runs.log")
	opts := task.Options{LockKeys: []string{lockKey}, WorkerTimeout: 10 * time.Second}
	blocker := fmt.Sprintf(`{"argv":["sh","-c",%q]}`, fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done", release))
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "blocker", Kind: "exec", Payload: json.RawMessage(blocker), Options: opts}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		startWorker(t, url, fmt.Sprintf("w%d", i+1), "--concurrency", "4", "--kinds", "exec")
	}
	eventually(t, time.Minute, "three live workers", func() bool {
		ws, err := st.Workers(ctx)
		return err == nil && len(ws) == 3
	})
	var host string
	eventually(t, time.Minute, "the blocker to start", func() bool {
		b, err := st.Get(ctx, "blocker")
		if err != nil || b.State != task.StateRunning {
			return false
		}
		host = b.Attempts[0].WorkerID
		return true
	})
	// The blocker's own worker keeps the tasks pinned to it parked in its
	// memory while the key is busy there: they enter the line only if they
	// find another task ahead once it frees.
	waiting := 0
	for i := range n {
		o := opts
		o.Priority = (i * 7) % 4 // 0, 3, 2, 1, 0, ...: publish order differs from rank order
		// Pinned round the workers, so that the line is served across
		// processes, not by the blocker's worker handing on to itself.
		o.SpecificWorkerIDs = []string{fmt.Sprintf("w%d", i%3+1)}
		if o.SpecificWorkerIDs[0] != host {
			waiting++
		}
		p := task.PublishParams{Key: fmt.Sprintf("cmd-%02d", i), Kind: "exec", Payload: json.RawMessage(execPayload(runLog, 50*time.Millisecond)), Options: o}
		if _, _, err := task.Publish(ctx, st, p); err != nil {
			t.Fatal(err)
		}
	}
	begin := time.Now()
	db, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(url, "sqlite:")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	last := -1
	eventually(t, time.Minute, "every waiting task to stand in the line", func() bool {
		var places int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM lock_lines WHERE lock_key = ?`, lockKey).Scan(&places)
		if err == nil && places != last {
			t.Logf("%d places in the line after %s", places, time.Since(begin).Round(time.Millisecond))
			last = places
		}
		// At least: a task of the blocker's own worker may have tried the
		// key before the blocker held it there, and entered the line too.
		return err == nil && places >= waiting
	})
	t.Logf("every waiting task in the line after %s", time.Since(begin).Round(time.Millisecond))
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	eventually(t, time.Minute, "every command to succeed", func() bool {
		all, err := st.List(ctx, task.ListQuery{State: task.StateSucceeded})
		return err == nil && len(all) == n+1
	})
	t.Logf("all run %s after the blocker was released", time.Since(freed).Round(time.Millisecond))

	all, err := st.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*task.Task
	for _, tk := range all {
		if tk.Key != "blocker" {
			cmds = append(cmds, tk)
		}
		if len(tk.Attempts) != 1 {
			t.Fatalf("%s ran %d attempts, want 1 (a claim stopped by the line writes nothing)", tk.Key, len(tk.Attempts))
		}
	}
	want := slices.Clone(cmds)
	slices.SortFunc(want, func(a, b *task.Task) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return int(a.Seq - b.Seq)
	})
	// The order and the overlap are judged by the programs' own start and
	// end lines: a claim's store time is taken before its locks are.
	byKey := map[string]*task.Task{}
	for _, tk := range cmds {
		byKey[tk.Key] = tk
	}
	var got []*task.Task
	var handoffs []time.Duration // from a program's end to the next one's start, on another worker
	var prevEnd time.Time
	var prev, prevWorker string
	for _, l := range readRunLog(t, runLog) {
		switch l.event {
		case "start":
			if !prevEnd.IsZero() {
				t.Logf("%s on %s started %s after %s ended", l.key, l.worker, l.at.Sub(prevEnd).Round(time.Millisecond), prev)
				if l.worker != prevWorker {
					handoffs = append(handoffs, l.at.Sub(prevEnd))
				}
			}
			if l.at.Before(prevEnd) {
				t.Errorf("%s started %s before %s ended: two holders of %s", l.key, prevEnd.Sub(l.at), prev, lockKey)
			}
			got = append(got, byKey[l.key])
		case "end":
			prevEnd, prev, prevWorker = l.at, l.key, l.worker
		}
	}
	// A figure, not an assertion: the test runs beside others on a busy
	// machine. A hand-off is a change event, a claim and the exec guard's
	// start; a second or more means something sleeps on the way.
	if len(handoffs) > 0 {
		slices.Sort(handoffs)
		t.Logf("hand-offs between worker processes: %d, median %s, max %s", len(handoffs),
			handoffs[len(handoffs)/2].Round(time.Millisecond), handoffs[len(handoffs)-1].Round(time.Millisecond))
	}
	workers := map[string]int{}
	for _, tk := range cmds {
		workers[tk.Attempts[0].WorkerID]++
	}
	t.Logf("lock line: %d commands run one at a time by workers %v", n, workers)
	if !slices.Equal(keys(got), keys(want)) {
		t.Fatalf("start order\n got %v\nwant %v (priority, then publish order)", keys(got), keys(want))
	}
}

func keys(ts []*task.Task) []string {
	out := make([]string, len(ts))
	for i, tk := range ts {
		out[i] = fmt.Sprintf("%s/p%d", tk.Key, tk.Priority)
	}
	return out
}
