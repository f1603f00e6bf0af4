package storetest

// Deletes: DeleteFinished (retention).

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// deleteFinished checks that only finished tasks of the given state written
// before the cutoff go, at most Limit per call, and never an unfinished or
// rerun one.
func (s suite) deleteFinished(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	old := time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)
	recent := time.Now().UTC().Truncate(time.Millisecond)
	finish := func(key string, state task.State, at time.Time) { t.Helper(); PutTask(t, st, key, "k", state, at) }
	for i := range 5 {
		finish(fmt.Sprintf("old-ok-%d", i), task.StateSucceeded, old)
	}
	finish("old-failed", task.StateFailed, old)
	finish("old-cancelled", task.StateCancelled, old)
	finish("new-ok", task.StateSucceeded, recent)
	finish("old-pending", task.StatePending, old)
	// A running task whose lease is long over is still not finished.
	finish("old-running", task.StateRunning, old)
	cutoff := recent.Add(-time.Minute)
	for _, k := range []string{"old-ok-0", "old-failed", "old-cancelled", "new-ok"} {
		if got := mustGet(t, st, k); !got.State.Finished() {
			t.Fatalf("setup: %s is %s", k, got.State)
		}
	}
	// Rerun one old task: it must survive although it was old when chosen.
	if _, err := task.Retry(ctx, st, "old-ok-4"); err != nil {
		t.Fatal(err)
	}

	n, err := st.DeleteFinished(ctx, task.DeleteParams{State: task.StateSucceeded, Before: cutoff, Limit: 3})
	if err != nil || n != 3 {
		t.Fatalf("DeleteFinished(succeeded, limit 3) = %d, %v; want 3", n, err)
	}
	n, err = st.DeleteFinished(ctx, task.DeleteParams{State: task.StateSucceeded, Before: cutoff, Limit: 100})
	if err != nil || n != 1 {
		t.Fatalf("second DeleteFinished(succeeded) = %d, %v; want 1", n, err)
	}
	for _, state := range []task.State{task.StateFailed, task.StateCancelled} {
		if n, err := st.DeleteFinished(ctx, task.DeleteParams{State: state, Before: cutoff, Limit: 100}); err != nil || n != 1 {
			t.Errorf("DeleteFinished(%s) = %d, %v; want 1", state, n, err)
		}
	}
	for i := range 4 {
		if _, err := st.Get(ctx, fmt.Sprintf("old-ok-%d", i)); !errors.Is(err, task.ErrNotFound) {
			t.Errorf("old-ok-%d: Get = %v, want ErrNotFound", i, err)
		}
	}
	for _, k := range []string{"old-failed", "old-cancelled"} {
		if _, err := st.Get(ctx, k); !errors.Is(err, task.ErrNotFound) {
			t.Errorf("%s: Get = %v, want ErrNotFound", k, err)
		}
	}
	for _, k := range []string{"old-ok-4", "new-ok", "old-pending", "old-running"} {
		mustGet(t, st, k)
	}
	if _, err := st.DeleteFinished(ctx, task.DeleteParams{State: task.StateRunning, Before: cutoff, Limit: 1}); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("DeleteFinished(running) = %v, want ErrInvalid", err)
	}
}

// PutTask inserts a task of key and kind and writes it into state as of at
// (its updated_at): pending, running (claimed at at by worker "w", so its
// lease has ended when at is long past), succeeded, failed or cancelled.
// Retention tests use it to make old tasks.
func PutTask(t testing.TB, st task.Store, key, kind string, state task.State, at time.Time) *task.Task {
	t.Helper()
	tk, err := task.NewTask(task.PublishParams{Key: key, Kind: kind, Options: task.Options{
		RunAt: at.Add(-time.Second), MaxUnexpectedRetries: task.NoRetries}}, at.Add(-time.Second))
	if err != nil {
		t.Fatalf("NewTask %s: %v", key, err)
	}
	if _, inserted, err := st.Insert(context.Background(), tk); err != nil || !inserted {
		t.Fatalf("Insert %s: inserted=%v err=%v", key, inserted, err)
	}
	got, err := task.Modify(context.Background(), st, key, func(tk *task.Task) error {
		switch state {
		case task.StateCancelled:
			return tk.Cancel(at)
		case task.StatePending:
			tk.Recompute(at)
			return nil
		}
		h := tk.Claim(task.Holder{WorkerID: "w", Instance: "i"}, at)
		switch state {
		case task.StateFailed:
			return tk.Fail(h, "boom", time.Time{}, at)
		case task.StateSucceeded:
			return tk.Succeed(h, at)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("PutTask %s %s: %v", key, state, err)
	}
	return got
}
