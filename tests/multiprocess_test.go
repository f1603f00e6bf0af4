package tests

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestThreeWorkerProcessesOneKilled runs 500 exec tasks on three worker
// processes sharing one store file, SIGKILLs one mid-run, and checks from
// the tasks' own log that every task succeeded, none was lost, and no task
// had more live attempts at once than it allows.
func TestThreeWorkerProcessesOneKilled(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "store.db")
	runLog := filepath.Join(dir, "run.log")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	const n = 500
	allowed := map[string]int{}
	for i := range n {
		p := task.PublishParams{
			Key: fmt.Sprintf("t%03d", i), Kind: "exec",
			Payload: json.RawMessage(execPayload(runLog, time.Duration(20+i%5*20)*time.Millisecond)),
			// Leases of the default 4 s, renewed every 400 ms: the test
			// checks that only the killed worker's leases are taken over,
			// and on a busy 2-core machine 24 race-built exec programs and
			// their guards on three workers stall every worker's writes to
			// the store for up to 2 s at times (renewals taking over a
			// second, a claim landing with little of its lease left), in
			// which a shorter lease of a live worker lapses.
			Options: task.Options{PingInterval: 400 * time.Millisecond, WorkerTimeout: task.DefaultWorkerTimeout, Priority: i % 3},
		}
		if i%10 == 0 {
			p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 2, 2
		}
		if _, _, err := task.Publish(ctx, store, p); err != nil {
			t.Fatal(err)
		}
		allowed[p.Key] = max(p.ConcurrentWorkerCnt, 1)
	}

	url := "sqlite:" + dbPath
	workers := []*workerProc{
		startWorker(t, url, "w1", "--concurrency", "8", "--kinds", "exec"),
		startWorker(t, url, "w2", "--concurrency", "8", "--kinds", "exec"),
		startWorker(t, url, "w3", "--concurrency", "8", "--kinds", "exec"),
	}
	succeeded := func() int {
		ts, err := store.List(ctx, task.ListQuery{State: task.StateSucceeded})
		if err != nil {
			t.Fatal(err)
		}
		return len(ts)
	}
	eventually(t, time.Minute, "a third of the tasks to finish", func() bool { return succeeded() >= n/3 })
	killedAt := map[string]time.Time{"w1": workers[0].kill(t)}
	t.Logf("killed w1 after %d tasks succeeded", succeeded())
	eventually(t, 2*time.Minute, "every task to succeed", func() bool { return succeeded() == n })

	all, err := store.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n {
		t.Fatalf("store holds %d tasks, published %d", len(all), n)
	}
	takenOver := 0
	for _, tk := range all {
		if tk.State != task.StateSucceeded {
			t.Errorf("task %s ended %s", tk.Key, tk.State)
		}
		last := 0
		for _, w := range tk.Attempts {
			if w.Attempt <= last {
				t.Errorf("task %s: attempt numbers do not grow: %+v", tk.Key, tk.Attempts)
			}
			last = w.Attempt
			if w.State == task.AttemptExpired {
				takenOver++
				if w.WorkerID != "w1" {
					b, _ := json.Marshal(tk.Attempts)
					t.Errorf("task %s: live worker %s lost its lease: %s", tk.Key, w.WorkerID, b)
				}
			}
		}
	}
	// A worker still running a task that others finished is stopped and
	// steps out (its entry is removed): its run ends within a ping or so of
	// the last success.
	stoppedAt := map[string]time.Time{}
	for _, tk := range all {
		for _, w := range tk.Attempts {
			if w.State == task.AttemptSuccess && w.EndedAt.After(stoppedAt[tk.Key]) {
				stoppedAt[tk.Key] = w.EndedAt.Add(time.Second)
			}
		}
	}
	runs := checkOverlaps(t, readRunLog(t, runLog), allowed, killedAt, stoppedAt)
	for _, tk := range all {
		if len(runs[tk.Key]) == 0 {
			t.Errorf("task %s succeeded but its program never ran", tk.Key)
		}
	}
	t.Logf("%d tasks succeeded; %d leases taken over from the killed worker", n, takenOver)
}
