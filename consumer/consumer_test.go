package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// ---- publish ----

func TestPublishConcurrentOneTaskOneRun(t *testing.T) {
	t.Parallel()
	e := setup(t)

	const n = 20
	var wg sync.WaitGroup
	gate := make(chan struct{})
	results := make([]task.PublishResult, n)
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-gate
			tk, res, err := task.Publish(context.Background(), e.store, params("once"))
			results[i], errs[i] = res, err
			if err == nil {
				ids[i] = tk.ID
			}
		})
	}
	close(gate)
	wg.Wait()
	inserted := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("publish %d: %v", i, errs[i])
		}
		if results[i] == task.Inserted {
			inserted++
		} else if results[i] != task.Existing {
			t.Errorf("publish %d: result %s, want inserted or existing", i, results[i])
		}
		if ids[i] != ids[0] {
			t.Errorf("publish %d returned task id %s, publish 0 returned %s", i, ids[i], ids[0])
		}
	}
	if inserted != 1 {
		t.Fatalf("%d publishes inserted, want exactly 1", inserted)
	}
	all, err := e.store.List(context.Background(), task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 {
		t.Fatalf("store holds %d tasks, want 1", len(all))
	}

	var calls atomic.Int32
	attempts := make(chan int, 10)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		calls.Add(1)
		send(attempts, job.Attempt)
		return nil
	})
	doc := e.waitState("once", task.StateSucceeded)
	if got := recv(t, attempts, "first run"); got != 1 {
		t.Errorf("first run has attempt %d, want 1", got)
	}
	if len(doc.Attempts) != 1 || calls.Load() != 1 {
		t.Fatalf("want one run: %d handler calls, workers %+v", calls.Load(), doc.Attempts)
	}

	// A finished task is left alone by a plain publish: nothing is written.
	again, res := e.publish("once")
	if res != task.Existing || again.Version != doc.Version {
		t.Fatalf("publish of finished task: result %s version %d, want existing at version %d", res, again.Version, doc.Version)
	}
	if v := e.get("once").Version; v != doc.Version {
		t.Fatalf("plain publish wrote the task: version %d -> %d", doc.Version, v)
	}

	// Rerun runs it again, with the next attempt number.
	_, res = e.publish("once", rerun())
	if res != task.Rerun {
		t.Fatalf("publish with rerun: result %s, want rerun", res)
	}
	if got := recv(t, attempts, "rerun"); got != 2 {
		t.Errorf("rerun has attempt %d, want 2", got)
	}
	doc = e.waitState("once", task.StateSucceeded)
	if calls.Load() != 2 || doc.AttemptsStarted != 2 || len(doc.Attempts) != 1 || doc.Attempts[0].Attempt != 2 {
		t.Fatalf("after rerun: %d calls, attempts %d, workers %+v; want 2 calls and one SUCCESS entry of attempt 2",
			calls.Load(), doc.AttemptsStarted, doc.Attempts)
	}
}

func TestPublishRerunLeavesRunningTask(t *testing.T) {
	t.Parallel()
	e := setup(t)
	started := make(chan *consumer.Job, 2)
	release := make(chan struct{})
	results := make(chan error, 2)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(started, job)
		err := hold(ctx, t, release)
		send(results, err)
		return err
	})
	e.publish("busy")
	job := recv(t, started, "handler start")

	before := e.get("busy")
	got, res := e.publish("busy", rerun())
	if res != task.Existing {
		t.Fatalf("rerun of a running task: result %s, want existing", res)
	}
	after := e.get("busy")
	if got.State != task.StateRunning || after.State != task.StateRunning || after.AttemptsStarted != before.AttemptsStarted ||
		entry(t, after, "A").State != task.AttemptRunning {
		t.Fatalf("rerun touched a running task: before %+v after %+v", before, after)
	}

	close(release)
	if err := recv(t, results, "handler end"); err != nil {
		t.Fatalf("handler was cancelled by a rerun publish: %v", err)
	}
	doc := e.waitState("busy", task.StateSucceeded)
	if len(doc.Attempts) != 1 || doc.Attempts[0].Attempt != job.Attempt || doc.AttemptsStarted != 1 {
		t.Fatalf("want one SUCCESS entry of attempt 1, have %+v (attempts %d)", doc.Attempts, doc.AttemptsStarted)
	}
	select {
	case j := <-started:
		t.Fatalf("task ran again, attempt %d", j.Attempt)
	default:
	}
}

// ---- scheduling ----

func TestDelayedTaskWaitsForRunAt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	started := make(chan time.Time, 2)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(started, time.Now())
		return nil
	})
	at := time.Now().Add(300 * time.Millisecond)
	e.publish("later", runAt(at))
	got := recv(t, started, "delayed task start")
	if got.Before(at) {
		t.Fatalf("delayed task started %s before its run_at", at.Sub(got))
	}
	e.waitState("later", task.StateSucceeded)
}

func TestPriorityThenPublishOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gateIn := make(chan struct{})
	releaseGate := make(chan struct{})
	order := make(chan string, 10)
	c := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Key == "gate" {
			close(gateIn)
			return hold(ctx, t, releaseGate)
		}
		send(order, job.Task.Key)
		return nil
	}, concurrency(1))
	e.publish("gate")
	recv(t, gateIn, "gate task start")

	e.publish("low", priority(1))
	e.publish("mid-a", priority(5))
	e.publish("high", priority(10))
	e.publish("mid-b", priority(5))
	e.publish("mid-c", priority(5))
	testutil.Eventually(t, waitLong, "5 tasks queued behind the gate", func() bool { return c.Stats().Queued == 5 })
	close(releaseGate)

	var got []string
	for range 5 {
		got = append(got, recv(t, order, "task start"))
	}
	want := []string{"high", "mid-a", "mid-b", "mid-c", "low"}
	if !slices.Equal(got, want) {
		t.Fatalf("start order %v, want %v", got, want)
	}
}

// ---- pinning ----

func TestPinnedTasksRunOnlyOnTheirWorker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	ranOn := map[string][]string{}
	h := func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		ranOn[job.Task.Key] = append(ranOn[job.Task.Key], job.WorkerID)
		mu.Unlock()
		return nil
	}
	e.worker("A", h)
	e.worker("B", h)
	var keys []string
	for i := range 4 {
		for _, w := range []string{"A", "B"} {
			key := fmt.Sprintf("for-%s-%d", w, i)
			keys = append(keys, key)
			e.publish(key, pinned(w))
		}
	}
	for _, key := range keys {
		doc := e.waitState(key, task.StateSucceeded)
		want := doc.SpecificWorkerIDs[0]
		mu.Lock()
		got := slices.Clone(ranOn[key])
		mu.Unlock()
		if !slices.Equal(got, []string{want}) || doc.Attempts[0].WorkerID != want {
			t.Errorf("%s pinned to %s ran on %v (workers %+v)", key, want, got, doc.Attempts)
		}
	}
}

func TestRepinCancelsRunningHandler(t *testing.T) {
	t.Parallel()
	e := setup(t)
	aIn := make(chan struct{}, 1)
	aCause := make(chan error, 1)
	bIn := make(chan *consumer.Job, 1)
	h := func(ctx context.Context, job *consumer.Job) error {
		if job.WorkerID == "A" {
			send(aIn, struct{}{})
			<-ctx.Done()
			send(aCause, context.Cause(ctx))
			return context.Cause(ctx)
		}
		send(bIn, job)
		return nil
	}
	e.worker("A", h)
	e.worker("B", h)
	// A long lease: B must take over because A lets go, not because the
	// lease ran out.
	const timeout = 20 * time.Second
	e.publish("move", pinned("A"), lease(100*time.Millisecond, timeout))
	recv(t, aIn, "A's handler start")

	t0 := time.Now()
	if _, err := task.Modify(context.Background(), e.store, "move", func(tk *task.Task) error {
		tk.SpecificWorkerIDs = []string{"B"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cause := recv(t, aCause, "A's handler cancelled")
	if !errors.Is(cause, task.ErrUnpinned) || !errors.Is(cause, task.ErrLeaseLost) {
		t.Fatalf("A's cause %v, want task.ErrUnpinned (a task.ErrLeaseLost)", cause)
	}
	job := recv(t, bIn, "B's handler start")
	if took := time.Since(t0); took > timeout/4 {
		t.Fatalf("B took over after %s; lease is %s", took, timeout)
	}
	if job.Attempt != 2 {
		t.Errorf("B runs attempt %d, want 2", job.Attempt)
	}
	doc := e.waitState("move", task.StateSucceeded)
	if len(doc.Attempts) != 1 || doc.Attempts[0].WorkerID != "B" || doc.Attempts[0].State != task.AttemptSuccess {
		t.Fatalf("want A's entry removed and B's SUCCESS, have %+v", doc.Attempts)
	}
}

// ---- several workers per task ----

func TestConcurrentWorkerCnt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var in atomic.Int32
	all := make(chan struct{})
	h := func(ctx context.Context, job *consumer.Job) error {
		if in.Add(1) == 3 {
			close(all)
		}
		return hold(ctx, t, all)
	}
	for _, id := range []string{"A", "B", "C"} {
		e.worker(id, h)
	}
	e.publish("wide", workers(3, 3))
	doc := e.waitState("wide", task.StateSucceeded)
	var ids []string
	var attempts []int
	for _, w := range doc.Attempts {
		if w.State != task.AttemptSuccess {
			t.Errorf("entry %+v is not SUCCESS", w)
		}
		ids = append(ids, w.WorkerID)
		attempts = append(attempts, w.Attempt)
	}
	slices.Sort(ids)
	slices.Sort(attempts)
	if !slices.Equal(ids, []string{"A", "B", "C"}) || !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Fatalf("want three distinct workers with attempts 1..3, have %+v", doc.Attempts)
	}
}

func TestSuccessWorkerCnt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var in atomic.Int32
	all := make(chan struct{})
	third := make(chan string, 1)
	causes := make(chan error, 1)
	releaseThird := make(chan struct{})
	h := func(ctx context.Context, job *consumer.Job) error {
		n := in.Add(1)
		if n == 3 {
			close(all)
		}
		if err := hold(ctx, t, all); err != nil {
			return err
		}
		if n <= 2 {
			return nil
		}
		send(third, job.WorkerID)
		err := hold(ctx, t, releaseThird)
		causes <- context.Cause(ctx)
		return err
	}
	for _, id := range []string{"A", "B", "C"} {
		e.worker(id, h)
	}
	e.publish("two-of-three", workers(3, 2))
	slow := recv(t, third, "third handler")
	e.waitState("two-of-three", task.StateSucceeded)
	// The third worker is stopped (the task is done) and steps out.
	if cause := recv(t, causes, "the third handler's end"); !errors.Is(cause, task.ErrTaskDone) {
		t.Fatalf("third handler ended with cause %v, want ErrTaskDone", cause)
	}
	close(releaseThird)
	var doc *task.Task
	testutil.Eventually(t, waitLong, "the stopped worker to step out", func() bool {
		doc = e.get("two-of-three")
		return len(doc.Attempts) == 2
	})
	for _, w := range doc.Attempts {
		if w.State != task.AttemptSuccess || w.WorkerID == slow {
			t.Fatalf("task ended with workers %+v; want two SUCCESS entries, none of %s", doc.Attempts, slow)
		}
	}
}

func TestMaxUnexpectedRetries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	c := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		calls.Add(1)
		return fmt.Errorf("attempt %d fails", job.Attempt)
	})
	e.publish("doomed", retries(2))
	doc := e.waitState("doomed", task.StateFailed)
	stop(t, c)
	if calls.Load() != 3 || len(doc.Attempts) != 3 {
		t.Fatalf("want 3 attempts, have %d calls and workers %+v", calls.Load(), doc.Attempts)
	}
	for i, w := range doc.Attempts {
		if w.State != task.AttemptFail || w.Attempt != i+1 || !strings.Contains(w.Error, fmt.Sprintf("attempt %d fails", i+1)) {
			t.Errorf("entry %d: %+v, want FAIL of attempt %d with its error", i, w, i+1)
		}
	}
}

// ---- leases ----

// claimAsGhost claims key by hand for a worker that will never ping.
func claimAsGhost(t *testing.T, e *env, key string) *task.Task {
	t.Helper()
	doc := e.get(key)
	next, h, err := preempt.ClaimTask(doc, task.Holder{WorkerID: "ghost"}, e.store.Now())
	if err != nil {
		t.Fatal(err)
	}
	if h.Attempt != 1 {
		t.Fatalf("ghost claim got attempt %d, want 1", h.Attempt)
	}
	if err := e.store.Update(context.Background(), next); err != nil {
		t.Fatal(err)
	}
	return next
}

func TestDeadWorkerLosesTaskToPeer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publish("orphan")
	ghost := claimAsGhost(t, e, "orphan")
	ghostUntil := ghost.Attempts[0].LeaseUntil

	type start struct {
		attempt int
		at      time.Time
	}
	starts := make(chan start, 4)
	release := make(chan struct{})
	e.worker("B", func(ctx context.Context, job *consumer.Job) error {
		send(starts, start{job.Attempt, time.Now()})
		return hold(ctx, t, release)
	})
	s := recv(t, starts, "B's takeover")
	if s.at.Before(ghostUntil) {
		t.Fatalf("B took the task %s before the ghost's lease ended", ghostUntil.Sub(s.at))
	}
	if s.attempt != 2 {
		t.Fatalf("B runs attempt %d, want 2", s.attempt)
	}
	running := e.get("orphan")
	if g := entry(t, running, "ghost"); g.State != task.AttemptExpired {
		t.Fatalf("ghost entry %+v, want EXPIRED", g)
	}

	// The ghost wakes up and tries to finish: refused, nothing written.
	finish := func(tk *task.Task) error {
		return tk.Succeed(task.Holder{WorkerID: "ghost", Attempt: 1}, e.store.Now())
	}
	if _, err := task.Modify(context.Background(), e.store, "orphan", finish); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("ghost's finish while B runs: %v, want task.ErrLeaseLost", err)
	}
	close(release)
	doc := e.waitState("orphan", task.StateSucceeded)
	if b := entry(t, doc, "B"); b.State != task.AttemptSuccess || b.Attempt != 2 || doc.AttemptsStarted != 2 {
		t.Fatalf("B's entry %+v attempts %d, want SUCCESS of attempt 2", b, doc.AttemptsStarted)
	}
	if _, err := task.Modify(context.Background(), e.store, "orphan", finish); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("ghost's finish after B: %v, want task.ErrLeaseLost", err)
	}
	if g := entry(t, e.get("orphan"), "ghost"); g.State != task.AttemptExpired {
		t.Fatalf("ghost entry became %+v", g)
	}

	// Attempts only grow: a rerun continues from 3.
	e.publish("orphan", rerun())
	if s := recv(t, starts, "rerun start"); s.attempt != 3 {
		t.Fatalf("rerun runs attempt %d, want 3", s.attempt)
	}
}

func TestExpiredWorkerExhaustsRetries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publish("fragile", retries(task.NoRetries))
	claimAsGhost(t, e, "fragile")
	var calls atomic.Int32
	e.worker("B", func(ctx context.Context, job *consumer.Job) error {
		calls.Add(1)
		return nil
	})
	doc := e.waitState("fragile", task.StateFailed)
	if g := entry(t, doc, "ghost"); g.State != task.AttemptExpired || calls.Load() != 0 || len(doc.Attempts) != 1 {
		t.Fatalf("want the ghost recorded EXPIRED and no run, have %+v and %d calls", doc.Attempts, calls.Load())
	}
}

// ---- handlers ----

func TestCancelCancelsHandler(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := make(chan struct{}, 1)
	causes := make(chan error, 1)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(in, struct{}{})
		<-ctx.Done()
		send(causes, context.Cause(ctx))
		return ctx.Err()
	})
	const timeout = 20 * time.Second
	e.publish("stopme", lease(200*time.Millisecond, timeout))
	recv(t, in, "handler start")
	t0 := time.Now()
	if _, err := task.Cancel(context.Background(), e.store, "stopme"); err != nil {
		t.Fatal(err)
	}
	cause := recv(t, causes, "handler cancelled")
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("handler saw the cancel after %s", took)
	}
	if !errors.Is(cause, task.ErrCancelled) {
		t.Fatalf("cause %v, want task.ErrCancelled", cause)
	}
	if doc := e.get("stopme"); doc.State != task.StateCancelled {
		t.Fatalf("state %s, want cancelled", doc.State)
	}
}

func TestPanicIsRecordedAsFailure(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Key == "bomb" {
			panic("boom")
		}
		return nil
	})
	e.publish("bomb", retries(task.NoRetries))
	doc := e.waitState("bomb", task.StateFailed)
	w := entry(t, doc, "A")
	if w.State != task.AttemptFail || !strings.Contains(w.Error, "panic") || !strings.Contains(w.Error, "boom") ||
		!strings.Contains(w.Error, "goroutine ") || !strings.Contains(w.Error, "consumer_test.go") {
		t.Fatalf("want a FAIL entry with the panic and its stack, have %+v", w)
	}
	// The worker survived the panic.
	e.publish("after-bomb")
	e.waitState("after-bomb", task.StateSucceeded)
}

func TestRetryableErrorsRetriedLocally(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	attempts := make(chan int, 10)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(attempts, job.Attempt)
		if calls.Add(1) < 3 {
			return consumer.Retryable(errors.New("flaky downstream"))
		}
		return nil
	})
	e.publish("flaky", retries(task.NoRetries))
	doc := e.waitState("flaky", task.StateSucceeded)
	if calls.Load() != 3 {
		t.Fatalf("handler called %d times, want 3", calls.Load())
	}
	for range 3 {
		if a := <-attempts; a != 1 {
			t.Errorf("local retry ran attempt %d, want 1", a)
		}
	}
	if len(doc.Attempts) != 1 || doc.Attempts[0].State != task.AttemptSuccess || doc.AttemptsStarted != 1 {
		t.Fatalf("want one SUCCESS entry of attempt 1, have %+v", doc.Attempts)
	}
}

func TestSnoozeReleasesWithoutSpendingRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const delay = 150 * time.Millisecond
	var calls atomic.Int32
	starts := make(chan time.Time, 10)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(starts, time.Now())
		if calls.Add(1) <= 2 {
			return consumer.Snooze(delay)
		}
		return nil
	})
	// No retries at all: were a snooze a failure, the task would fail.
	e.publish("sleepy", retries(task.NoRetries))
	doc := e.waitState("sleepy", task.StateSucceeded)
	if calls.Load() != 3 {
		t.Fatalf("handler called %d times, want 3", calls.Load())
	}
	prev := <-starts
	for range 2 {
		next := <-starts
		if gap := next.Sub(prev); gap < delay {
			t.Errorf("snoozed task ran again after %s, want at least %s", gap, delay)
		}
		prev = next
	}
	if len(doc.Attempts) != 1 || doc.Attempts[0].State != task.AttemptSuccess || doc.Attempts[0].Attempt != 3 {
		t.Fatalf("want only the SUCCESS entry of attempt 3, have %+v", doc.Attempts)
	}
}

// ---- shutdown ----

func TestStopLetsShortHandlerFinish(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := make(chan struct{}, 1)
	causes := make(chan error, 1)
	c := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(in, struct{}{})
		select {
		case <-time.After(200 * time.Millisecond): // the handler's work
			send(causes, nil)
			return nil
		case <-ctx.Done():
			send(causes, context.Cause(ctx))
			return ctx.Err()
		}
	}, shutdownAfter(5*time.Second))
	e.publish("short")
	recv(t, in, "handler start")
	stop(t, c)
	if cause := recv(t, causes, "handler end"); cause != nil {
		t.Fatalf("short handler was cancelled by Stop: %v", cause)
	}
	if doc := e.get("short"); doc.State != task.StateSucceeded {
		t.Fatalf("after Stop the task is %s with workers %+v, want succeeded", doc.State, doc.Attempts)
	}
}

func TestStopReleasesLongHandlersLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := make(chan struct{}, 1)
	causes := make(chan error, 1)
	a := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(in, struct{}{})
		<-ctx.Done()
		send(causes, context.Cause(ctx))
		return context.Cause(ctx)
	}, shutdownAfter(200*time.Millisecond))
	const timeout = 20 * time.Second
	e.publish("long", lease(100*time.Millisecond, timeout))
	recv(t, in, "A's handler start")
	stop(t, a)
	if cause := recv(t, causes, "A's handler end"); !errors.Is(cause, consumer.ErrShutdown) {
		t.Fatalf("A's cause %v, want consumer.ErrShutdown", cause)
	}
	doc := e.get("long")
	if doc.State != task.StatePending || len(doc.Attempts) != 0 || doc.AttemptsStarted != 1 {
		t.Fatalf("after Stop: state %s workers %+v; want pending with A's entry removed", doc.State, doc.Attempts)
	}

	t0 := time.Now()
	jobs := make(chan *consumer.Job, 1)
	e.worker("B", func(ctx context.Context, job *consumer.Job) error {
		send(jobs, job)
		return nil
	})
	job := recv(t, jobs, "B's claim")
	if took := time.Since(t0); took > timeout/4 {
		t.Fatalf("B claimed after %s; lease is %s", took, timeout)
	}
	if job.Attempt != 2 {
		t.Errorf("B runs attempt %d, want 2", job.Attempt)
	}
	e.waitState("long", task.StateSucceeded)
}

func TestCancelledStartContextReleasesLeases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, _ := e.workerCtx(ctx, "A", func(ctx context.Context, job *consumer.Job) error {
		send(in, struct{}{})
		<-ctx.Done()
		return ctx.Err()
	})
	e.publish("held", lease(100*time.Millisecond, 5*time.Second))
	recv(t, in, "handler start")
	cancel()
	stop(t, a)
	doc := e.get("held")
	if doc.State != task.StatePending || len(doc.Attempts) != 0 {
		t.Fatalf("after the Start context ended: state %s workers %+v; want the lease released", doc.State, doc.Attempts)
	}
}

// ---- discovery ----

// farFuture publishes a task due in an hour so that the worker's heap is
// never empty: then only the change stream (not the empty-heap query) can
// bring new tasks in.
func farFuture(e *env) {
	e.publish("far-future", runAt(time.Now().Add(time.Hour)))
}

func TestDiscoveryByQueryAndStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	farFuture(e)
	for i := range 5 {
		e.publish(fmt.Sprintf("before-%d", i))
	}
	var calls atomic.Int32
	c := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		calls.Add(1)
		return nil
	}, func(c *consumer.Config) { c.SafetyNetInterval, c.PollInterval = time.Hour, time.Hour })
	for i := range 5 {
		e.waitState(fmt.Sprintf("before-%d", i), task.StateSucceeded)
	}
	testutil.Eventually(t, waitLong, "the far-future task queued", func() bool { return c.Stats().Queued == 1 })
	for i := range 5 {
		e.publish(fmt.Sprintf("after-%d", i))
	}
	for i := range 5 {
		e.waitState(fmt.Sprintf("after-%d", i), task.StateSucceeded)
	}
	if calls.Load() != 10 {
		t.Fatalf("%d handler calls, want 10", calls.Load())
	}
}

func TestHeapOverflowRequeries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 100
	for i := range n {
		e.publish(fmt.Sprintf("t-%03d", i))
	}
	var mu sync.Mutex
	runs := map[string]int{}
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		runs[job.Task.Key]++
		mu.Unlock()
		return nil
	}, func(c *consumer.Config) { c.HeapSize, c.PageSize, c.Concurrency = 10, 7, 4 })
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("all %d tasks to succeed", n), func() bool {
		done, err := e.store.List(context.Background(), task.ListQuery{State: task.StateSucceeded})
		return err == nil && len(done) == n
	})
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if k := fmt.Sprintf("t-%03d", i); runs[k] != 1 {
			t.Errorf("%s ran %d times", k, runs[k])
		}
	}
}

// TestUrgentTaskPassesFullHeap: a task of higher priority published while
// the heap is full of a backlog takes the place of a backlog entry and
// runs next, instead of waiting for the heap to drain and be queried.
func TestUrgentTaskPassesFullHeap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 50 {
		e.publish(fmt.Sprintf("b-%03d", i))
	}
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	c := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		order = append(order, job.Task.Key)
		mu.Unlock()
		if job.Task.Key == "b-000" {
			return hold(ctx, t, release)
		}
		return nil
	}, func(c *consumer.Config) { c.HeapSize, c.PageSize, c.Concurrency = 10, 10, 1 })
	testutil.Eventually(t, waitLong, "the first backlog task to run", func() bool { return e.get("b-000").State == task.StateRunning })
	for i := range 5 { // the heap full again
		e.publish(fmt.Sprintf("c-%03d", i))
	}
	testutil.Eventually(t, waitLong, "a full heap", func() bool { return c.Stats().Queued == 10 })
	e.publish("urgent", priority(10))
	// The urgent task's event reaches the full heap: it displaces a task,
	// which neither Stats nor a store write shows; give it the time it takes.
	time.Sleep(200 * time.Millisecond)
	close(release)
	e.waitState("urgent", task.StateSucceeded)
	mu.Lock()
	defer mu.Unlock()
	if len(order) < 2 || order[1] != "urgent" {
		t.Fatalf("runs began %v; want urgent right after b-000", order[:min(len(order), 5)])
	}
}

func TestWorkerOnAnotherStoreHandle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other := e.open()
	farFuture(e)
	e.publish("before")
	ran := make(chan string, 10)
	c := e.worker("P2", func(ctx context.Context, job *consumer.Job) error {
		send(ran, job.Task.Key)
		return nil
	}, onStore(other), func(c *consumer.Config) { c.SafetyNetInterval, c.PollInterval = time.Hour, time.Hour })
	if k := recv(t, ran, "task published before start"); k != "before" {
		t.Fatalf("ran %s, want before", k)
	}
	testutil.Eventually(t, waitLong, "the far-future task queued", func() bool { return c.Stats().Queued == 1 })
	for i := range 3 {
		e.publish(fmt.Sprintf("after-%d", i))
	}
	for i := range 3 {
		e.waitState(fmt.Sprintf("after-%d", i), task.StateSucceeded)
	}
	if doc := e.get("after-2"); doc.Attempts[0].WorkerID != "P2" {
		t.Fatalf("after-2 ran on %s", doc.Attempts[0].WorkerID)
	}
}

// ---- lock keys ----

func TestLockKeysNeverOverlap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	type interval struct{ start, end time.Time }
	var (
		mu        sync.Mutex
		intervals []interval
		inFlight  atomic.Int32
		overlaps  atomic.Int32
	)
	h := func(ctx context.Context, job *consumer.Job) error {
		if inFlight.Add(1) > 1 {
			overlaps.Add(1)
		}
		start := time.Now()
		select {
		case <-time.After(20 * time.Millisecond): // the handler's work
		case <-ctx.Done():
		}
		end := time.Now()
		inFlight.Add(-1)
		mu.Lock()
		intervals = append(intervals, interval{start, end})
		mu.Unlock()
		return ctx.Err()
	}
	for _, id := range []string{"A", "B", "C"} {
		e.worker(id, h, onStore(e.open())) // as three processes
	}
	const n = 10
	t0 := time.Now()
	for i := range n {
		e.publish(fmt.Sprintf("cmd-%d", i), lockKeys("device:1"))
	}
	for i := range n {
		e.waitState(fmt.Sprintf("cmd-%d", i), task.StateSucceeded)
	}
	t.Logf("%d lock-sharing tasks took %s", n, time.Since(t0))
	if overlaps.Load() > 0 {
		t.Fatalf("%d handler starts overlapped another holder of the lock", overlaps.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(intervals, func(i, j int) bool { return intervals[i].start.Before(intervals[j].start) })
	for i := 1; i < len(intervals); i++ {
		if intervals[i].start.Before(intervals[i-1].end) {
			t.Errorf("run %d started before run %d ended", i, i-1)
		}
	}
}

// TestDuplicateWorkerIDRefused: a second consumer under a live worker id
// does not start; it names the holder. Once the first stops, the id is free.
func TestDuplicateWorkerIDRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.worker("dup", func(context.Context, *consumer.Job) error { return nil })
	second, err := consumer.New(consumer.Config{Store: e.open(), Handler: consumer.NewMux(), WorkerID: "dup", Logger: e.log})
	if err != nil {
		t.Fatal(err)
	}
	err = second.Start(context.Background())
	var taken *task.WorkerIDTakenError
	if !errors.As(err, &taken) || taken.Holder.Instance != first.Instance() || taken.Holder.PID != os.Getpid() {
		t.Fatalf("second Start under a live id: %v; want a *task.WorkerIDTakenError naming the first (instance %s)", err, first.Instance())
	}
	ws, err := e.store.Workers(context.Background())
	if err != nil || len(ws) != 1 || ws[0].Instance != first.Instance() || !ws[0].Live(e.store.Now()) {
		t.Fatalf("registry = %+v, %v; want the first worker, live", ws, err)
	}
	stop(t, first)
	if ws, _ := e.store.Workers(context.Background()); len(ws) != 0 {
		t.Fatalf("registry after Stop = %+v; want empty", ws)
	}
	third := e.worker("dup", func(context.Context, *consumer.Job) error { return nil })
	if third.Instance() == first.Instance() {
		t.Fatal("two consumers got one instance id")
	}
}

// TestFailedTaskBacksOff: a failed attempt is retried after the retry
// policy's delay, by any worker, not at once.
func TestFailedTaskBacksOff(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const delay = 300 * time.Millisecond
	starts := make(chan time.Time, 4)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(starts, time.Now())
		return errors.New("boom")
	}, func(c *consumer.Config) { c.RetryPolicy = func(int, error) time.Duration { return delay } })
	e.publish("flaky")
	first := recv(t, starts, "first attempt")
	second := recv(t, starts, "second attempt")
	if gap := second.Sub(first); gap < delay {
		t.Fatalf("second attempt %s after the first, want at least the backoff %s", gap, delay)
	}
	doc := e.get("flaky")
	if len(doc.Attempts) < 1 || doc.Attempts[0].State != task.AttemptFail {
		t.Fatalf("workers %+v", doc.Attempts)
	}
}

func TestExponentialBackoff(t *testing.T) {
	t.Parallel()
	p := consumer.ExponentialBackoff(time.Second, 5*time.Minute)
	for failures, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: 5 * time.Minute, 30: 5 * time.Minute} {
		for range 20 {
			if d := p(failures, nil); d < want*3/4 || d > want*5/4 {
				t.Fatalf("failures %d: delay %s, want %s ±25%%", failures, d, want)
			}
		}
	}
	if d := consumer.ExponentialBackoff(0, time.Minute)(3, nil); d != 0 {
		t.Fatalf("zero first delay: %s, want 0", d)
	}
}
