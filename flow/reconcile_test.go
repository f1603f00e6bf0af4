package flow

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func openStore(t testing.TB) task.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "tasks.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func threeSteps() []Step {
	zero := 0
	return []Step{
		{Name: "a", Action: Action{Kind: "k"}, Rollback: &Action{Kind: "k"}},
		{Name: "b", Action: Action{Kind: "k"}, Rollback: &Action{Kind: "k"}},
		{Name: "c", Action: Action{Kind: "k", Retries: &zero}, Rollback: &Action{Kind: "k"}},
	}
}

// finish claims the task of key as worker w and succeeds or fails it, as
// a worker without the middleware (or one that died after its write) would
// leave it.
func finish(t *testing.T, s task.Store, key string, ok bool) {
	t.Helper()
	_, err := task.Modify(context.Background(), s, key, func(tk *task.Task) error {
		now := s.Now()
		h := tk.Claim(task.Holder{TaskKey: key, WorkerID: "w", Instance: "i"}, now)
		if ok {
			return tk.Succeed(h, now)
		}
		return tk.Fail(h, "boom", now, now)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustState(t *testing.T, s task.Store, key string, want State, cursor int) *Flow {
	t.Helper()
	f, err := Get(context.Background(), s, key)
	if err != nil {
		t.Fatal(err)
	}
	if f.State != want || f.Cursor != cursor {
		t.Fatalf("flow %s: %s at %d, want %s at %d", key, f.State, f.Cursor, want, cursor)
	}
	return f
}

// A crash between the flow's write and the next publish, and step tasks
// that finished without their outcome reaching the flow: Reconcile
// repairs both, once.
func TestReconcile(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	if _, _, err := Publish(ctx, s, Spec{Key: "f", Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	// Step a's outcome recorded, then the recorder "crashed" before
	// publishing step b.
	if _, err := modify(ctx, s, "f", func(f *Flow) error {
		f.apply(outcome{Gen: 1, Step: 0, Success: true, Result: json.RawMessage(`{"x":1}`), At: s.Now()})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	bKey := StepKey("f", 1, 1, "b", false)
	if _, err := s.Get(ctx, bKey); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("step b published already: %v", err)
	}
	st, err := Reconcile(ctx, s, nil)
	if err != nil || st != (ReconcileStats{Active: 1, Published: 1}) {
		t.Fatalf("reconcile: %+v %v", st, err)
	}
	b, err := s.Get(ctx, bKey)
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	if err := json.Unmarshal(b.Payload, &env); err != nil || string(env.Params["a"]) != `{"x":1}` {
		t.Fatalf("step b's envelope: %s %v", b.Payload, err)
	}
	if st, err = Reconcile(ctx, s, nil); err != nil || st != (ReconcileStats{Active: 1}) {
		t.Fatalf("second reconcile: %+v %v", st, err)
	}
	// b succeeds with no middleware: the reconciler moves the flow on.
	finish(t, s, bKey, true)
	if st, err = Reconcile(ctx, s, nil); err != nil || st.Advanced != 1 {
		t.Fatalf("reconcile after b: %+v %v", st, err)
	}
	mustState(t, s, "f", StateRunning, 2)
	// c fails for good (no retries): rollback of c, then b, then a.
	finish(t, s, StepKey("f", 1, 2, "c", false), false)
	if _, err = Reconcile(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	mustState(t, s, "f", StateRollingBack, 2)
	for i, name := range []string{"c", "b", "a"} {
		finish(t, s, StepKey("f", 1, 2-i, name, true), true)
		if _, err = Reconcile(ctx, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	f := mustState(t, s, "f", StateFailed, 0)
	if f.Progress[2].Do.Error != "boom" {
		t.Fatalf("c's error %q", f.Progress[2].Do.Error)
	}
	// A stopped flow's document is kept until it is older than the cutoff.
	if n, err := DeleteStopped(ctx, s, f.UpdatedAt, 10); err != nil || n != 0 {
		t.Fatalf("DeleteStopped at the flow's last write: %d, %v; want it kept", n, err)
	}
	if n, err := DeleteStopped(ctx, s, f.UpdatedAt.Add(time.Millisecond), 10); err != nil || n != 1 {
		t.Fatalf("DeleteStopped after the flow's last write: %d, %v; want it deleted", n, err)
	}
	if _, err := Get(ctx, s, "f"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a deleted stopped flow: %v; want ErrNotFound", err)
	}
}

// TestDeleteStoppedKeepsMovingFlows: however old, a flow still moving is
// never deleted.
func TestDeleteStoppedKeepsMovingFlows(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	if _, _, err := Publish(ctx, s, Spec{Key: "f", Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	if n, err := DeleteStopped(ctx, s, s.Now().Add(time.Hour), 10); err != nil || n != 0 {
		t.Fatalf("DeleteStopped over a running flow: %d, %v; want none", n, err)
	}
	mustState(t, s, "f", StateRunning, 0)
}

// A step task claimed again after its outcome reached the flow (its worker
// died before the task's own write) is not run again.
func TestMiddlewareSkipsRecordedStep(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	if _, _, err := Publish(ctx, s, Spec{Key: "f", Params: json.RawMessage(`{"p":2}`), Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	aKey := StepKey("f", 1, 0, "a", false)
	runs := 0
	h := Middleware(MiddlewareConfig{Store: s})(consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
		runs++
		if string(job.Task.Payload) != "{}" && len(job.Task.Payload) != 0 {
			t.Errorf("handler got the envelope: %s", job.Task.Payload)
		}
		if string(Params(ctx)["p"]) != "2" {
			t.Errorf("params %v", Params(ctx))
		}
		return job.SetResult("done")
	}))
	doc, err := s.Get(ctx, aKey)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		if err := h.Handle(ctx, &consumer.Job{Task: doc, Attempt: attempt}); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 1 {
		t.Fatalf("step ran %d times", runs)
	}
	f := mustState(t, s, "f", StateRunning, 1)
	if string(f.Params["a"]) != `"done"` || f.Progress[0].Do.Attempt != 1 {
		t.Fatalf("recorded %s attempt %d", f.Params["a"], f.Progress[0].Do.Attempt)
	}
	if _, err := s.Get(ctx, StepKey("f", 1, 1, "b", false)); err != nil {
		t.Fatalf("next step not published: %v", err)
	}
}

// crashGap advances flow key past step i as a recorder that died before
// publishing the next step would, and returns the key that goes missing.
func crashGap(t *testing.T, s task.Store, key string, i int) string {
	t.Helper()
	f, err := modify(context.Background(), s, key, func(f *Flow) error {
		f.apply(outcome{Gen: 1, Step: i, Success: true, At: s.Now()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return f.Progress[i+1].Do.Task
}

// lockHolder returns who holds the reconciler's lease.
func lockHolder(t *testing.T, s task.Store) string {
	t.Helper()
	now := s.Now()
	err := s.AcquireLocks(context.Background(), task.LockParams{Namespace: task.LockSingleton, Keys: []string{ReconcileLockKey},
		Holder: task.Holder{TaskKey: "probe", WorkerID: "probe"}, Now: now, Until: now.Add(time.Millisecond)})
	var locked *task.LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("the reconciler's lease is not held: %v", err)
	}
	return locked.Holder.WorkerID
}

// Every worker runs a Reconciler; the lease holder repairs a crash gap,
// and after it stops, a peer takes the lease and repairs the next.
func TestReconcilerLease(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	if _, _, err := Publish(ctx, s, Spec{Key: "f", Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	recs := map[string]*Reconciler{}
	for _, id := range []string{"a", "b"} {
		r, err := NewReconciler(ReconcilerConfig{Store: s, WorkerID: id, Every: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop(ctx) })
		recs[id] = r
	}
	waitTask := func(key string) {
		t.Helper()
		testutil.Eventually(t, time.Minute, key+" to be published", func() bool { _, err := s.Get(ctx, key); return err == nil })
	}
	waitTask(crashGap(t, s, "f", 0))
	first := lockHolder(t, s)
	if err := recs[first].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitTask(crashGap(t, s, "f", 1))
	if second := lockHolder(t, s); second == first {
		t.Fatalf("%s still holds the lease after Stop", second)
	}
}

// TestUndoWaitsForOutsideCancel: a step task cancelled from outside the
// flow (dashboard, API) fails the step, and its undo waits for the
// cancelled handler's lease, as an undo after a flow cancel does.
func TestUndoWaitsForOutsideCancel(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	if _, _, err := Publish(ctx, s, Spec{Key: "f", Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	finish(t, s, StepKey("f", 1, 0, "a", false), true)
	if _, err := Reconcile(ctx, s, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	doB := StepKey("f", 1, 1, "b", false)
	running, err := task.Modify(ctx, s, doB, func(tk *task.Task) error {
		tk.Claim(task.Holder{TaskKey: doB, WorkerID: "w", Instance: "i"}, s.Now())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lease := running.Attempts[0].LeaseUntil
	if _, err := task.Cancel(ctx, s, doB); err != nil {
		t.Fatal(err)
	}
	if _, err := Reconcile(ctx, s, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	mustState(t, s, "f", StateRollingBack, 1)
	undo, err := s.Get(ctx, StepKey("f", 1, 1, "b", true))
	if err != nil {
		t.Fatal(err)
	}
	if undo.RunAt.Before(lease) {
		t.Fatalf("undo of b runs at %s, before the cancelled do's lease ends at %s", undo.RunAt, lease)
	}
}

// TestResultTooBigFailsStep: a result that would push the shared
// parameters past MaxParamsSize fails its step (and rolls back) rather
// than wedge the flow on a document the store refuses.
func TestResultTooBigFailsStep(t *testing.T) {
	f := &Flow{Key: "f", Steps: threeSteps(), Params: map[string]json.RawMessage{}, Gen: 1, Progress: make([]Progress, 3)}
	f.startDo(0, time.Now())
	big := json.RawMessage(`"` + strings.Repeat("x", MaxParamsSize) + `"`)
	if !f.apply(outcome{Gen: 1, Step: 0, Success: true, Result: big, At: time.Now()}) {
		t.Fatal("apply refused the outcome")
	}
	if f.State != StateRollingBack || f.Progress[0].Do.State != RunFailed || !strings.Contains(f.Error, "does not fit") {
		t.Fatalf("flow %s, do %s, error %q: want the step failed for its result's size and rolling back", f.State, f.Progress[0].Do.State, f.Error)
	}
}
