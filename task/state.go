package task

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Counts summarises a worker list at one instant.
type Counts struct {
	Live       int // RUNNING with a lease ahead
	Expired    int // RUNNING with a lease passed
	Success    int
	Unexpected int // FAIL and recorded EXPIRED entries
}

// CountWorkers counts t's workers at now.
func (t *Task) CountWorkers(now time.Time) Counts {
	var c Counts
	for _, w := range t.Workers {
		switch {
		case w.Live(now):
			c.Live++
		case w.Expired(now):
			c.Expired++
		case w.State == WorkerSuccess:
			c.Success++
		case w.State == WorkerFail, w.State == WorkerExpired:
			c.Unexpected++
		}
	}
	return c
}

// Recompute derives State and NextClaimAt from the worker list at now.
// Expired RUNNING entries count as live for the stored state until a claim
// or a reap records them: a stored state cannot change as time passes.
func (t *Task) Recompute(now time.Time) {
	c := t.CountWorkers(now)
	switch {
	case t.Cancelled:
		t.State = StateCancelled
	case c.Success >= t.SuccessWorkerCnt:
		t.State = StateSucceeded
	case c.Unexpected > t.MaxUnexpectedRetries:
		t.State = StateFailed
	case c.Live+c.Expired > 0:
		t.State = StateRunning
	default:
		t.State = StatePending
	}
	t.NextClaimAt = time.Time{}
	if t.State.Finished() {
		return
	}
	if c.Live < t.ConcurrentWorkerCnt {
		// A slot is free now (or as soon as RunAt passes).
		t.NextClaimAt = t.RunAt
		return
	}
	// Full: the earliest lease to expire frees a slot, or lets a claimer
	// record the failure.
	for _, w := range t.Workers {
		if w.Live(now) && (t.NextClaimAt.IsZero() || w.LeaseUntil.Before(t.NextClaimAt)) {
			t.NextClaimAt = w.LeaseUntil
		}
	}
}

// Entry returns the index of workerID's entry with attempt, or -1.
func (t *Task) Entry(workerID string, attempt int) int {
	return slices.IndexFunc(t.Workers, func(w Worker) bool {
		return w.WorkerID == workerID && w.Attempt == attempt
	})
}

// Allows reports whether workerID may run t under its pins.
func (t *Task) Allows(workerID string) bool {
	return len(t.SpecificWorkerIDs) == 0 || slices.Contains(t.SpecificWorkerIDs, workerID)
}

// holding returns the index of workerID's RUNNING entry for attempt, or an
// error wrapping ErrLeaseLost that says why it is gone.
func (t *Task) holding(workerID string, attempt int) (int, error) {
	if t.Cancelled {
		return -1, fmt.Errorf("task %s: %w", t.Key, ErrCancelled)
	}
	if t.State.Finished() {
		// Enough workers succeeded (or too many failed): the rest stop.
		return -1, fmt.Errorf("task %s is %s: %w", t.Key, t.State, ErrTaskDone)
	}
	i := t.Entry(workerID, attempt)
	if i < 0 || t.Workers[i].State != WorkerRunning {
		return -1, fmt.Errorf("task %s attempt %d: %w", t.Key, attempt, ErrLeaseLost)
	}
	return i, nil
}

// live is holding for writes that need the lease still ahead of now (renew,
// finish): an expired lease is lost even before a peer takes it.
func (t *Task) live(workerID string, attempt int, now time.Time) (int, error) {
	i, err := t.holding(workerID, attempt)
	if err == nil && !t.Workers[i].Live(now) {
		return -1, fmt.Errorf("task %s attempt %d: lease expired at %s: %w", t.Key, attempt, t.Workers[i].LeaseUntil.Format(time.RFC3339Nano), ErrLeaseLost)
	}
	return i, err
}

// Renew extends workerID's lease to now+WorkerTimeout. It fails with an
// error wrapping ErrLeaseLost when the entry is gone, the task was
// cancelled, or the worker is no longer among the pins (see Unpin).
func (t *Task) Renew(workerID string, attempt int, now time.Time) error {
	i, err := t.live(workerID, attempt, now)
	if err != nil {
		return err
	}
	if !t.Allows(workerID) {
		return fmt.Errorf("task %s: %w", t.Key, ErrUnpinned)
	}
	t.Workers[i].LeaseUntil = now.Add(time.Duration(t.WorkerTimeout)).UTC()
	t.touch(now)
	return nil
}

// Unpin removes workerID's RUNNING entry when the pins no longer allow it,
// so a permitted worker may take over at once without waiting for the
// lease to expire. It reports whether it changed t.
func (t *Task) Unpin(workerID string, attempt int, now time.Time) bool {
	i := t.Entry(workerID, attempt)
	if t.Allows(workerID) || i < 0 || t.Workers[i].State != WorkerRunning {
		return false
	}
	t.Workers = slices.Delete(t.Workers, i, i+1)
	t.touch(now)
	return true
}

// Finish records workerID's outcome: success when errMsg is empty. It is
// refused with ErrLeaseLost unless the worker is still RUNNING.
func (t *Task) Finish(workerID string, attempt int, success bool, errMsg string, now time.Time) error {
	i, err := t.live(workerID, attempt, now)
	if err != nil {
		return err
	}
	w := &t.Workers[i]
	w.EndedAt = now.UTC()
	if success {
		w.State = WorkerSuccess
	} else {
		w.State, w.Error = WorkerFail, errMsg
	}
	t.touch(now)
	return nil
}

// Release removes workerID's RUNNING entry without counting a failure, so a
// peer can claim at once (graceful shutdown).
func (t *Task) Release(workerID string, attempt int, now time.Time) error {
	i, err := t.holding(workerID, attempt)
	if errors.Is(err, ErrTaskDone) {
		// Other workers finished it: this one steps out as well.
		if i = t.Entry(workerID, attempt); i >= 0 && t.Workers[i].State == WorkerRunning {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	t.Workers = slices.Delete(t.Workers, i, i+1)
	t.touch(now)
	return nil
}

// Cancel marks t cancelled; running handlers learn it at their next ping.
func (t *Task) Cancel(now time.Time) error {
	if t.State.Finished() {
		return fmt.Errorf("cancel %s: %w (it is %s)", t.Key, ErrFinished, t.State)
	}
	t.Cancelled = true
	t.touch(now)
	return nil
}

// Reset clears a finished task's workers so it runs again (publish with
// rerun, or retry). A task that is not finished is left as it is and
// Reset returns ErrNotFinished.
func (t *Task) Reset(now time.Time) error {
	if !t.State.Finished() {
		return fmt.Errorf("reset %s: %w (it is %s)", t.Key, ErrNotFinished, t.State)
	}
	// Workers still running (stopping at their next ping) keep their slot
	// until their leases end: the rerun starts after.
	runAt := now
	for _, w := range t.Workers {
		if w.Live(now) && w.LeaseUntil.After(runAt) {
			runAt = w.LeaseUntil
		}
	}
	t.Workers = []Worker{}
	t.Cancelled = false
	if t.RunAt.Before(runAt) {
		t.RunAt = runAt.UTC()
	}
	t.touch(now)
	return nil
}

// DropExpired records expired RUNNING entries as EXPIRED failures.
// It reports how many it recorded.
func (t *Task) DropExpired(now time.Time) int {
	n := 0
	for i := range t.Workers {
		if w := &t.Workers[i]; w.Expired(now) {
			w.State, w.EndedAt, w.Error = WorkerExpired, now.UTC(), "lease expired"
			n++
		}
	}
	if n > 0 {
		t.touch(now)
	}
	return n
}

// touch recomputes derived fields after a mutation. Version is bumped by
// the store's compare-and-set write, not here.
func (t *Task) touch(now time.Time) {
	t.UpdatedAt = now.UTC()
	t.Recompute(now)
}

// Snooze gives workerID's attempt back without counting a failure and
// delays the next claim until until.
func (t *Task) Snooze(workerID string, attempt int, until, now time.Time) error {
	if err := t.Release(workerID, attempt, now); err != nil {
		return err
	}
	if until.After(t.RunAt) {
		t.RunAt = until.UTC()
	}
	t.touch(now)
	return nil
}
