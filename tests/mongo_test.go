package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// TestMongoServerOutage stops an H2-backed server for 10 s while two
// worker processes run over a hundred exec tasks, then starts it again on
// the same port and file. Long-lease tasks (ping 1s, timeout 30s) must
// ride the outage out: their handlers keep running and their outcomes are
// written once the server is back, so none is cancelled. Short-lease tasks
// (ping 500ms, timeout 2s) running at the outage lose their leases and are
// taken over after it. Every task must end succeeded with no attempts
// overlapping.
func TestMongoServerOutage(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	base, stop, restart := testservers.StartMongo(t, filepath.Join(t.TempDir(), "h2.db"))
	uri := mongoDBURI(t, base)
	runLog := filepath.Join(t.TempDir(), "run.log")
	store := openMongoStore(t, ctx, uri, nil)

	// The long tasks are enough to fill both workers' slots before, during
	// and after the outage; the wire test server runs a few of them a
	// second under -race, so more would only lengthen the drain.
	const (
		nLong  = 120
		nShort = 6
		outage = 10 * time.Second
	)
	// The lease outlasts the outage plus the server's restart (a JVM start
	// that compiles the launcher: seconds on a loaded machine).
	longOpts := task.Options{PingInterval: time.Second, WorkerTimeout: 30 * time.Second, MaxUnexpectedRetries: 5}
	shortOpts := task.Options{PingInterval: 500 * time.Millisecond, WorkerTimeout: 2 * time.Second, MaxUnexpectedRetries: 5, Priority: 10}
	allowed := map[string]int{}
	long := map[string]bool{}
	for i := range nLong {
		p := task.PublishParams{Key: fmt.Sprintf("long%03d", i), Kind: "exec",
			Payload: json.RawMessage(watchedExecPayload(runLog, time.Duration(200+i%4*100)*time.Millisecond)), Options: longOpts}
		if _, _, err := task.Publish(ctx, store, p); err != nil {
			t.Fatal(err)
		}
		allowed[p.Key], long[p.Key] = 1, true
	}
	workers := []*workerProc{
		startWorker(t, uri, "o1", "--concurrency", "4", "--kinds", "exec"),
		startWorker(t, uri, "o2", "--concurrency", "4", "--kinds", "exec"),
	}
	eventually(t, time.Minute, "a third of the long tasks to succeed", func() bool {
		return countState(t, ctx, store, task.StateSucceeded) >= nLong/3
	})
	// Short-lease tasks jump the queue; stop the server once they all run,
	// so their leases end during the outage.
	var short []string
	for i := range nShort {
		p := task.PublishParams{Key: fmt.Sprintf("short%d", i), Kind: "exec",
			Payload: json.RawMessage(watchedExecPayload(runLog, 6*time.Second)), Options: shortOpts}
		if _, _, err := task.Publish(ctx, store, p); err != nil {
			t.Fatal(err)
		}
		allowed[p.Key] = 1
		short = append(short, p.Key)
	}
	eventually(t, 30*time.Second, "every short-lease task to run", func() bool {
		for _, k := range short {
			tk, err := store.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if tk.State != task.StateRunning {
				return false
			}
		}
		return true
	})
	before := countState(t, ctx, store, task.StateSucceeded)
	stoppedAt := time.Now()
	stop()
	t.Logf("server stopped with %d of %d tasks succeeded; stopping took %s", before, nLong+nShort, time.Since(stoppedAt).Round(time.Millisecond))
	time.Sleep(outage - time.Since(stoppedAt)) // the outage the test is about
	restart()
	backAt := time.Now()
	t.Logf("server back after %s", backAt.Sub(stoppedAt).Round(time.Millisecond))
	for _, w := range workers {
		if w.cmd.ProcessState != nil {
			t.Fatalf("worker %s exited during the outage: %s", w.id, w.cmd.ProcessState)
		}
	}

	eventually(t, 90*time.Second, "every task to succeed after the outage", func() bool {
		return countState(t, ctx, store, task.StateSucceeded) == nLong+nShort
	})
	t.Logf("all tasks succeeded %s after the server came back", time.Since(backAt).Round(time.Millisecond))

	all, err := store.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != nLong+nShort {
		t.Fatalf("store holds %d tasks, published %d", len(all), nLong+nShort)
	}
	runs := attemptsFromLog(t, readRunLog(t, runLog))
	// No process was killed. A handler is cancelled (its program killed,
	// with no end line) only when its lease is lost, which for a short
	// lease happens during the outage; it ran at most until the server
	// was back. A long-lease handler is never cancelled.
	// Claimed before the stop, that is: the program itself may log its
	// start later (a guard and a shell to start on a loaded machine).
	claimedAt := map[string]time.Time{}
	for _, tk := range all {
		for _, w := range tk.Attempts {
			claimedAt[fmt.Sprintf("%s#%d", tk.Key, w.Attempt)] = w.StartedAt
		}
	}
	resolveUnended(t, runs, "it was not a short-lease attempt running at the outage", func(a *attemptRun) (time.Time, bool) {
		claimed, ok := claimedAt[fmt.Sprintf("%s#%d", a.key, a.attempt)]
		if long[a.key] || !ok || claimed.After(stoppedAt) {
			return time.Time{}, false
		}
		return backAt, true
	})
	checkStoreAgainstLog(t, all, runs)
	checkLiveAttempts(t, runs, allowed)
	checkEndedWithinLease(t, all, runs, 500*time.Millisecond)
	retried, shortTakeovers := 0, 0
	for _, tk := range all {
		if long[tk.Key] && len(tk.Attempts) > 1 {
			retried++
			t.Logf("long-lease task %s ran more than once: %s", tk.Key, fmtWorkers(tk))
		}
		if !long[tk.Key] {
			if len(tk.Attempts) > 1 {
				shortTakeovers++
			}
			t.Logf("short-lease task %s: %s; log: %s", tk.Key, fmtWorkers(tk), fmtRuns(runs[tk.Key]))
		}
	}
	// A claim in flight when the server stopped may have been written with
	// its answer lost: that lease is then orphaned and expires. Allow one.
	if retried > 1 {
		t.Errorf("%d long-lease tasks ran more than once: their workers did not ride the outage out", retried)
	}
	t.Logf("%d short-lease tasks were taken over after the outage; %d long-lease tasks ran more than once", shortTakeovers, retried)
}

// TestMongoClockSkew runs two in-process consumers on one database; B's
// local clock is 30 s ahead. The store's offset to the server clock must
// correct it: B's Store.Now agrees with A's, B never starts a task A holds
// live, and B takes over a dead holder's task only once that lease has
// expired in server time.
func TestMongoClockSkew(t *testing.T) {
	ctx := testContext(t, time.Minute)
	uri := sharedMongoDB(t)
	const skew = 30 * time.Second
	storeA := openMongoStore(t, ctx, uri, nil)
	storeB := openMongoStore(t, ctx, uri, &mongostore.Config{Clock: func() time.Time { return time.Now().Add(skew) }})

	if d := storeB.Now().Sub(storeA.Now()).Abs(); d > time.Second {
		t.Fatalf("B's store clock is %s away from A's (offsets A %s, B %s): the skew is not corrected", d, storeA.Offset(), storeB.Offset())
	}
	if d := (storeB.Offset() + skew).Abs(); d > time.Second {
		t.Errorf("B's offset is %s, want about %s", storeB.Offset(), -skew)
	}
	t.Logf("offsets: A %s, B %s; B.Now - A.Now = %s", storeA.Offset(), storeB.Offset(), storeB.Now().Sub(storeA.Now()))

	// The ghost: a task pinned to "ghost" and B, claimed by hand by a
	// worker that never pings. Claimed before B starts.
	ghostOpts := task.Options{PingInterval: time.Second, WorkerTimeout: 5 * time.Second, SpecificWorkerIDs: []string{"ghost", "B"}}
	if _, _, err := task.Publish(ctx, storeA, task.PublishParams{Key: "ghosted", Kind: "hold", Options: ghostOpts}); err != nil {
		t.Fatal(err)
	}
	claimed, err := task.Modify(ctx, storeA, "ghosted", func(tk *task.Task) error {
		// Only a claim the consumer itself could make: the task is new,
		// unheld and admits the ghost.
		if tk.State != task.StatePending || len(tk.Attempts) != 0 || !tk.Allows("ghost") {
			return fmt.Errorf("ghosted is not claimable by the ghost: state %s, workers %+v", tk.State, tk.Attempts)
		}
		tk.Claim(task.Holder{WorkerID: "ghost"}, storeA.Now())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ghostUntil := claimed.Attempts[0].LeaseUntil

	type start struct {
		worker, key string
		at          time.Time // server time as A's store sees it
		job         *consumer.Job
	}
	var mu sync.Mutex
	var starts []start
	onStart := func(job *consumer.Job) {
		mu.Lock()
		starts = append(starts, start{job.WorkerID, job.Task.Key, storeA.Now(), job})
		mu.Unlock()
	}
	startsOf := func(worker, key string) []start {
		mu.Lock()
		defer mu.Unlock()
		var out []start
		for _, s := range starts {
			if s.worker == worker && s.key == key {
				out = append(out, s)
			}
		}
		return out
	}
	const hold = 4 * time.Second
	newConsumer := func(id string, s task.Store) *consumer.Consumer {
		mux := consumer.NewMux()
		mux.RegisterFunc("hold", func(ctx context.Context, job *consumer.Job) error {
			d := hold
			if job.Task.Key == "ghosted" {
				d = 100 * time.Millisecond
			}
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
		mux.Use(func(next consumer.Handler) consumer.Handler {
			return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
				onStart(job)
				return next.Handle(ctx, job)
			})
		})
		c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: id, Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := newConsumer("A", storeA)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Stop(context.Background())

	liveOpts := task.Options{PingInterval: 200 * time.Millisecond, WorkerTimeout: time.Second}
	if _, _, err := task.Publish(ctx, storeA, task.PublishParams{Key: "held", Kind: "hold", Options: liveOpts}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "A to start the held task", func() bool { return len(startsOf("A", "held")) > 0 })

	b := newConsumer("B", storeB)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if now := storeA.Now(); !now.Before(ghostUntil) {
		t.Fatalf("the ghost's lease ended (%s) before B started (%s): the test is too slow to check early takeover", ghostUntil, now)
	}

	eventually(t, 20*time.Second, "the held task to succeed", func() bool {
		tk, err := storeA.Get(ctx, "held")
		if err != nil {
			t.Fatal(err)
		}
		return tk.State == task.StateSucceeded
	})
	held, _ := storeA.Get(ctx, "held")
	if ss := startsOf("B", "held"); len(ss) > 0 {
		t.Errorf("B started the task A held live at %s: %s", ss[0].at.Format(time.StampMicro), fmtWorkers(held))
	}
	if len(held.Attempts) != 1 || held.Attempts[0].WorkerID != "A" || held.Attempts[0].State != task.AttemptSuccess {
		t.Errorf("held task: want one SUCCESS by A, got %s", fmtWorkers(held))
	}

	eventually(t, 15*time.Second, "B to take over the ghost's task", func() bool { return len(startsOf("B", "ghosted")) > 0 })
	ss := startsOf("B", "ghosted")
	late := ss[0].at.Sub(ghostUntil)
	t.Logf("B took over the ghost's task %s after its lease ended (server time)", late.Round(time.Millisecond))
	if late < 0 || late > 3*time.Second {
		t.Errorf("B started the ghost's task at %s, lease ended at %s: want within [0, 3s] after, got %s",
			ss[0].at.Format(time.StampMicro), ghostUntil.Local().Format(time.StampMicro), late)
	}
	j := ss[0].job // stored times have millisecond precision
	if i := j.Task.Entry(j.Holder()); i < 0 || j.Task.Attempts[i].StartedAt.Before(ghostUntil.Truncate(time.Millisecond)) {
		t.Errorf("B's claim of the ghost's task is stamped before the ghost's lease ended (%s): %s", ghostUntil.Local().Format(time.StampMicro), fmtWorkers(j.Task))
	}
	eventually(t, 10*time.Second, "the ghost's task to succeed", func() bool {
		tk, err := storeA.Get(ctx, "ghosted")
		if err != nil {
			t.Fatal(err)
		}
		return tk.State == task.StateSucceeded
	})
	if ss := startsOf("A", "ghosted"); len(ss) > 0 {
		t.Errorf("A started a task not pinned to it")
	}
}

// TestMongoLatency runs `leasepool bench` against a fresh database on the
// wire test server and logs the publish-to-start latency across processes
// (and the rest of its report). It asserts only that the bench ran, so its
// runs are small: the wire test server drains about 50 tasks a second
// under -race, and the figures worth quoting come from `leasepool bench`
// at its defaults (docs/performance.md).
func TestMongoLatency(t *testing.T) {
	uri := sharedMongoDB(t)
	cmd := exec.Command(leasepoolBin(t), "--store", uri, "--log-level", "error", "bench", "--json",
		"--tasks", "200", "--latency-tasks", "100", "--runs", "1", "--pending", "0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	began := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s\nstderr:\n%s", err, out, tail(stderr.String(), 4000))
	}
	var rep map[string]any
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("bench output is not JSON: %v\n%s", err, out)
	}
	t.Logf("bench took %s: publish-to-start across processes p50 %vms p99 %vms (p90 %vms, max %vms); in process p50 %vms p99 %vms",
		time.Since(began).Round(time.Millisecond),
		rep["publish_to_start_cross_process_p50_ms"], rep["publish_to_start_cross_process_p99_ms"],
		rep["publish_to_start_cross_process_p90_ms"], rep["publish_to_start_cross_process_max_ms"],
		rep["publish_to_start_in_process_p50_ms"], rep["publish_to_start_in_process_p99_ms"])
	t.Logf("bench report: %s", out)
	if p50, ok := rep["publish_to_start_cross_process_p50_ms"].(float64); !ok || p50 <= 0 {
		t.Errorf("bench reported no cross-process latency: %s", out)
	}
}
