package flow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// rig is a store on disk and one worker with the example's handlers.
type rig struct {
	store task.Store
	logs  *testutil.SyncBuffer
	mu    sync.Mutex
	ran   []string
	// inside counts test.exclusive handlers running; maxInside the most.
	inside, maxInside atomic.Int32
	// flaky counts test.flaky runs: the first fails, retryably.
	flaky atomic.Int32
	// gate holds test.gate handlers until it is closed.
	gate chan struct{}
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "tasks.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r := &rig{store: s, logs: &testutil.SyncBuffer{}, gate: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s, Logger: log}); err != nil {
		t.Fatal(err)
	}
	dbHandlers(mux, func(line string) {
		r.mu.Lock()
		r.ran = append(r.ran, line)
		r.mu.Unlock()
	})
	mux.RegisterFunc("test.block", func(ctx context.Context, job *consumer.Job) error {
		r.mu.Lock()
		r.ran = append(r.ran, "block")
		r.mu.Unlock()
		<-ctx.Done()
		return context.Cause(ctx)
	})
	mux.RegisterFunc("test.gate", func(ctx context.Context, job *consumer.Job) error {
		select {
		case <-r.gate:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	mux.RegisterFunc("test.flaky", func(ctx context.Context, job *consumer.Job) error {
		if r.flaky.Add(1) == 1 {
			return consumer.Retryable(errors.New("flaky once"))
		}
		return nil
	})
	mux.RegisterFunc("test.step", func(ctx context.Context, job *consumer.Job) error {
		// A DAG step: says when it starts and ends, fails when its
		// payload says so.
		ref, _ := flow.CurrentStep(ctx)
		dir := "do"
		if ref.Undo {
			dir = "undo"
		}
		r.mu.Lock()
		r.ran = append(r.ran, "start "+ref.Name+" "+dir)
		r.mu.Unlock()
		time.Sleep(30 * time.Millisecond) // a step's work: steps that may overlap do
		r.mu.Lock()
		r.ran = append(r.ran, "end "+ref.Name+" "+dir)
		r.mu.Unlock()
		if string(job.Task.Payload) == `"fail"` {
			return errors.New("injected failure")
		}
		return job.SetResult(ref.Name)
	})
	mux.RegisterFunc("test.exclusive", func(ctx context.Context, job *consumer.Job) error {
		if n := r.inside.Add(1); n > r.maxInside.Load() {
			r.maxInside.Store(n)
		}
		defer r.inside.Add(-1)
		time.Sleep(50 * time.Millisecond) // a step's work: steps that may overlap do
		return nil
	})
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w1", Logger: log, RetryPolicy: consumer.NoBackoff})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(context.Background()) })
	return r
}

func (r *rig) runs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran)
}

func (r *rig) publish(t *testing.T, key, params string, steps []flow.Step) {
	t.Helper()
	if _, _, err := flow.Publish(context.Background(), r.store, flow.Spec{Key: key, Params: json.RawMessage(params), Steps: steps}); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) wait(t *testing.T, key string) *flow.Flow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := waitFinished(ctx, r.store, key)
	if err != nil {
		t.Fatalf("%v\nran: %v\nlogs:\n%s", err, r.runs(), r.logs)
	}
	return f
}

func wantRuns(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("handlers ran\n %v\nwant\n %v", got, want)
	}
}

func TestHappyPath(t *testing.T) {
	r := newRig(t)
	r.publish(t, "db-1", `{"name":"db-1","cpu":4}`, dbSteps())
	f := r.wait(t, "db-1")
	if f.State != flow.StateSucceeded {
		t.Fatalf("state %s, error %q", f.State, f.Error)
	}
	wantRuns(t, r.runs(), "db-1 db.check", "db-1 db.init", "db-1 db.deduct")
	if got := string(f.Params["init"]); got != `{"instance":"inst-db-1"}` {
		t.Fatalf("params.init = %s", got)
	}
	for i, p := range f.Progress {
		if p.Do.State != flow.RunSucceeded || p.Undo.State != flow.RunNone || p.Do.EndedAt.Before(p.Do.StartedAt) {
			t.Fatalf("step %d progress %+v", i+1, p)
		}
		if want := flow.StepKey("db-1", 1, i, f.Steps[i].Name, false); p.Do.Task != want {
			t.Fatalf("step %d task %q, want %q", i+1, p.Do.Task, want)
		}
		// The flow records a step before its task's own outcome is written.
		waitTaskState(t, r.store, p.Do.Task, task.StateSucceeded)
	}
	// Idempotent by key: publishing again changes nothing and runs nothing.
	_, res, err := flow.Publish(context.Background(), r.store, flow.Spec{Key: "db-1", Steps: dbSteps()})
	if err != nil || res != task.Existing {
		t.Fatalf("publish again: %v %v", res, err)
	}
	if again, _ := flow.Get(context.Background(), r.store, "db-1"); again.Version != f.Version {
		t.Fatalf("publish again wrote the flow: version %d -> %d", f.Version, again.Version)
	}
}

func TestStepFailsRollsBackInReverse(t *testing.T) {
	r := newRig(t)
	r.publish(t, "db-2", `{"name":"db-2","cpu":8,"fail":"init"}`, dbSteps())
	f := r.wait(t, "db-2")
	if f.State != flow.StateFailed {
		t.Fatalf("state %s", f.State)
	}
	// init has one retry: two attempts, then clean (2) and alert (1).
	wantRuns(t, r.runs(), "db-2 db.check", "db-2 db.init", "db-2 db.init", "db-2 db.clean", "db-2 db.alert")
	init := f.Progress[1]
	if init.Do.State != flow.RunFailed || init.Do.Failures != 2 || !strings.Contains(init.Do.Error, "injected failure") {
		t.Fatalf("init progress %+v", init.Do)
	}
	if f.Progress[2].Do.State != flow.RunNone || f.Progress[2].Undo.State != flow.RunNone {
		t.Fatalf("deduct ran or was undone: %+v", f.Progress[2])
	}
	if !f.Progress[1].Undo.EndedAt.After(time.Time{}) || f.Progress[0].Undo.StartedAt.Before(f.Progress[1].Undo.EndedAt) {
		t.Fatalf("rollbacks not in reverse order: %+v", f.Progress)
	}
	types := eventTypes(f)
	if !slices.Equal(types, []string{flow.EventStepFailed, flow.EventRolledBack}) {
		t.Fatalf("events %v", types)
	}
}

func eventTypes(f *flow.Flow) []string {
	var out []string
	for _, e := range f.Events {
		out = append(out, e.Type)
	}
	return out
}

func TestRollbackFails(t *testing.T) {
	r := newRig(t)
	r.publish(t, "db-3", `{"name":"db-3","fail":"deduct","fail_undo":"init"}`, dbSteps())
	f := r.wait(t, "db-3")
	if f.State != flow.StateRollbackFailed {
		t.Fatalf("state %s", f.State)
	}
	// deduct fails twice, restore (3) runs, clean (2) fails twice; alert (1)
	// does not run: the flow stops for a human.
	wantRuns(t, r.runs(), "db-3 db.check", "db-3 db.init", "db-3 db.deduct", "db-3 db.deduct",
		"db-3 db.restore", "db-3 db.clean", "db-3 db.clean")
	last := f.Events[len(f.Events)-1]
	if last.Type != flow.EventRollbackFailed || last.Step != "init" || !strings.Contains(last.Message, "injected failure") {
		t.Fatalf("last event %+v", last)
	}
	// The error is logged once the outcome is written: it may come just
	// after the state is seen.
	testutil.Eventually(t, 5*time.Second, "the rollback failure logged as an error",
		func() bool { return strings.Contains(r.logs.String(), "level=ERROR msg=\"flow rollback failed") })
	// Retry runs again from the first step whose work does not stand.
	rf, err := flow.Retry(context.Background(), r.store, "db-3")
	if err != nil || rf.Gen != 2 || rf.Cursor != 1 {
		t.Fatalf("retry: gen %d cursor %d err %v", rf.Gen, rf.Cursor, err)
	}
}

func TestCancel(t *testing.T) {
	r := newRig(t)
	steps := dbSteps()
	steps[1].Action = flow.Action{Kind: "test.block"}
	r.publish(t, "c-1", `{"name":"c-1"}`, steps)
	r.publish(t, "c-2", `{"name":"c-2"}`, steps)
	ctx := context.Background()
	waitRuns(t, r, 4) // both checks and both blocks
	if _, err := flow.Cancel(ctx, r.store, "c-1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := flow.Cancel(ctx, r.store, "c-2", false); err != nil {
		t.Fatal(err)
	}
	f1, f2 := r.wait(t, "c-1"), r.wait(t, "c-2")
	if f1.State != flow.StateFailed || f1.Progress[1].Do.State != flow.RunCancelled || f1.Progress[1].Undo.State != flow.RunSucceeded || f1.Progress[0].Undo.State != flow.RunSucceeded {
		t.Fatalf("c-1 cancelled with rollback: %s %+v", f1.State, f1.Progress)
	}
	if f2.State != flow.StateCancelled || f2.Progress[0].Undo.State != flow.RunNone {
		t.Fatalf("c-2 cancelled without rollback: %s %+v", f2.State, f2.Progress)
	}
	waitTaskState(t, r.store, f2.Progress[1].Do.Task, task.StateCancelled)
	// c-1's rollback of the cancelled step waited for its lease to end:
	// the cancelled handler stops only at its next ping.
	do, err := r.store.Get(ctx, f1.Progress[1].Do.Task)
	if err != nil {
		t.Fatal(err)
	}
	undo, err := r.store.Get(ctx, f1.Progress[1].Undo.Task)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range do.Attempts {
		if undo.RunAt.Before(w.LeaseUntil) {
			t.Fatalf("undo due at %s, before the cancelled attempt's lease ended (%s)", undo.RunAt, w.LeaseUntil)
		}
	}
	if _, err := flow.Cancel(ctx, r.store, "c-2", false); !errors.Is(err, flow.ErrFinished) {
		t.Fatalf("cancel a cancelled flow: %v", err)
	}
	if _, err := flow.Retry(ctx, r.store, "c-1-missing"); !errors.Is(err, flow.ErrNotFound) {
		t.Fatalf("retry a missing flow: %v", err)
	}
}

func waitTaskState(t *testing.T, s task.Store, key string, want task.State) {
	t.Helper()
	testutil.Eventually(t, time.Minute, fmt.Sprintf("task %s to be %s", key, want), func() bool {
		st, err := s.Get(context.Background(), key)
		return err == nil && st.State == want
	})
}

func waitRuns(t *testing.T, r *rig, n int) {
	t.Helper()
	testutil.Eventually(t, time.Minute, fmt.Sprintf("%d runs", n), func() bool { return len(r.runs()) >= n })
}

func TestRetryAfterRollback(t *testing.T) {
	r := newRig(t)
	r.publish(t, "db-4", `{"name":"db-4","fail":"init"}`, dbSteps())
	if f := r.wait(t, "db-4"); f.State != flow.StateFailed {
		t.Fatalf("state %s", f.State)
	}
	n := len(r.runs())
	f, err := flow.Retry(context.Background(), r.store, "db-4")
	if err != nil {
		t.Fatal(err)
	}
	if f.Gen != 2 || f.Cursor != 0 || f.Progress[0].Do.Task != "db-4/1/check/do#2" {
		t.Fatalf("after retry: gen %d cursor %d task %q", f.Gen, f.Cursor, f.Progress[0].Do.Task)
	}
	if _, stale := f.Params["check"]; stale || string(f.Params["name"]) != `"db-4"` {
		t.Fatalf("after retry: params %v, want the request's only", f.Params)
	}
	// Still failing at init: the same reverse rollback, with new task keys.
	if f = r.wait(t, "db-4"); f.State != flow.StateFailed {
		t.Fatalf("state %s", f.State)
	}
	wantRuns(t, r.runs()[n:], "db-4 db.check", "db-4 db.init", "db-4 db.init", "db-4 db.clean", "db-4 db.alert")
	if _, err := flow.Retry(context.Background(), r.store, "db-4"); err != nil {
		t.Fatal(err)
	}
	if _, err := flow.Retry(context.Background(), r.store, "db-4"); !errors.Is(err, flow.ErrNotFinished) {
		t.Fatalf("retry of a running flow: %v", err)
	}
}

// A step's lock keys are its task's: steps of several flows that name one
// resource run one at a time, though the worker runs eight handlers.
func TestStepLockKeys(t *testing.T) {
	r := newRig(t)
	step := flow.Step{Name: "print", Action: flow.Action{Kind: "test.exclusive", LockKeys: []string{"printer"}, Priority: 2}}
	for i := range 6 {
		r.publish(t, fmt.Sprintf("p-%d", i), `{}`, []flow.Step{step})
	}
	for i := range 6 {
		if f := r.wait(t, fmt.Sprintf("p-%d", i)); f.State != flow.StateSucceeded {
			t.Fatalf("p-%d: %s", i, f.State)
		}
	}
	if n := r.maxInside.Load(); n != 1 {
		t.Fatalf("%d steps holding lock printer ran at once", n)
	}
	tk, err := r.store.Get(context.Background(), "p-0/1/print/do")
	if err != nil || !slices.Equal(tk.LockKeys, []string{"printer"}) || tk.Priority != 2 {
		t.Fatalf("step task: %v %v", tk, err)
	}
}

// A Retryable error is retried by the consumer within the lease, through
// the middleware again: it must not end a step that has no retries.
func TestRetryableStepRetriedInLease(t *testing.T) {
	r := newRig(t)
	zero := 0
	r.publish(t, "flaky", `{}`, []flow.Step{{Name: "once", Action: flow.Action{Kind: "test.flaky", Retries: &zero},
		Rollback: &flow.Action{Kind: "test.flaky"}}})
	f := r.wait(t, "flaky")
	if f.State != flow.StateSucceeded || f.Progress[0].Do.Failures != 1 || f.Progress[0].Undo.State != flow.RunNone {
		t.Fatalf("%s, progress %+v", f.State, f.Progress[0])
	}
	if n := r.flaky.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestValidate(t *testing.T) {
	ok := func() flow.Spec { return flow.Spec{Key: "k", Steps: dbSteps()} }
	neg := -1
	for _, c := range []struct {
		field string
		edit  func(s *flow.Spec)
	}{
		{"key", func(s *flow.Spec) { s.Key = "" }},
		{"key", func(s *flow.Spec) { s.Key = strings.Repeat("k", 300) }},
		{"params", func(s *flow.Spec) { s.Params = json.RawMessage(`[1]`) }},
		{"steps", func(s *flow.Spec) { s.Steps = nil }},
		{"steps[1].name", func(s *flow.Spec) { s.Steps[1].Name = "check" }},
		{"steps[0].kind", func(s *flow.Spec) { s.Steps[0].Kind = "" }},
		{"steps[2].payload", func(s *flow.Spec) { s.Steps[2].Payload = json.RawMessage(`{`) }},
		{"steps[1].rollback.retries", func(s *flow.Spec) { s.Steps[1].Rollback.Retries = &neg }},
		{"steps[0].timeout", func(s *flow.Spec) { s.Steps[0].Timeout = -1 }},
		{"steps[2].rollback.lock_keys", func(s *flow.Spec) { s.Steps[2].Rollback.LockKeys = []string{""} }},
	} {
		s := ok()
		c.edit(&s)
		err := s.Validate()
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%s: got %v", c.field, err)
		}
	}
	if err := ok().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStepKey(t *testing.T) {
	for _, c := range []struct {
		gen, i int
		undo   bool
		want   string
	}{{1, 0, false, "f/1/s/do"}, {1, 2, true, "f/3/s/undo"}, {3, 0, false, "f/1/s/do#3"}} {
		if got := flow.StepKey("f", c.gen, c.i, "s", c.undo); got != c.want {
			t.Errorf("StepKey(%d,%d,%v) = %q, want %q", c.gen, c.i, c.undo, got, c.want)
		}
	}
}

// TestRollbackDoesNotWaitForTheFailedAttemptsLease: a failed step's undo
// is published to run at once: the attempt whose failure started the
// rollback has returned from its handler, so its lease, still live until
// its own outcome's write, guards nothing (it held the rollback back by a
// whole lease).
func TestRollbackDoesNotWaitForTheFailedAttemptsLease(t *testing.T) {
	r := newRig(t)
	r.publish(t, "db-5", `{"name":"db-5","fail":"deduct"}`, dbSteps())
	f := r.wait(t, "db-5")
	i := slices.IndexFunc(f.Steps, func(s flow.Step) bool { return s.Name == "deduct" })
	if i < 0 || f.Progress[i].Undo.Task == "" {
		t.Fatalf("no rollback of deduct: %s %+v", f.State, f.Progress)
	}
	ctx := context.Background()
	do, err := r.store.Get(ctx, f.Progress[i].Do.Task)
	if err != nil {
		t.Fatal(err)
	}
	undo, err := r.store.Get(ctx, f.Progress[i].Undo.Task)
	if err != nil {
		t.Fatal(err)
	}
	var last task.Attempt
	for _, w := range append(do.History, do.Attempts...) {
		if w.Attempt > last.Attempt {
			last = w
		}
	}
	if !undo.RunAt.Before(last.LeaseUntil) {
		t.Fatalf("the undo runs at %s, at the failed attempt's lease end %s; want at once (created %s)",
			undo.RunAt.Format(time.StampMilli), last.LeaseUntil.Format(time.StampMilli), undo.CreatedAt.Format(time.StampMilli))
	}
}

// TestReapedStepMovesTheFlowOnAtOnce: a step task whose worker died with
// its last retry, reaped by the next worker's claim, moves its flow on
// from that worker (consumer.Config.Reaped), with no reconciler running:
// the reconciler's pass, a lease later when its holder died too, is not
// waited for.
func TestReapedStepMovesTheFlowOnAtOnce(t *testing.T) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "tasks.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	zero := 0
	if _, _, err := flow.Publish(ctx, s, flow.Spec{Key: "r-1", Steps: []flow.Step{
		{Name: "only", Action: flow.Action{Kind: "test.never", Retries: &zero}}}}); err != nil {
		t.Fatal(err)
	}
	key := flow.StepKey("r-1", 1, 0, "only", false)
	// A worker claims the step with a short lease and dies.
	if _, err := task.Modify(ctx, s, key, func(tk *task.Task) error {
		tk.WorkerTimeout = task.Duration(300 * time.Millisecond)
		tk.Claim(task.Holder{TaskKey: key, WorkerID: "ghost", Instance: "i"}, s.Now())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s, Logger: log}); err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}, 1)
	mux.RegisterFunc("test.never", func(context.Context, *consumer.Job) error { ran <- struct{}{}; return nil })
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w1", Logger: log,
		Reaped: func(ctx context.Context, tk *task.Task) {
			if err := flow.TaskFinished(ctx, s, tk, log); err != nil {
				t.Errorf("reaped: %v", err)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	var f *flow.Flow
	testutil.Eventually(t, 10*time.Second, "the flow to finish after its step's last worker died", func() bool {
		var err error
		if f, err = flow.Get(ctx, s, "r-1"); err != nil {
			t.Fatal(err)
		}
		return f.State.Finished()
	})
	if f.State != flow.StateFailed {
		t.Fatalf("flow ended %s; want failed", f.State)
	}
	select {
	case <-ran:
		t.Fatal("the reaped step ran; it had no retries left")
	default:
	}
}
