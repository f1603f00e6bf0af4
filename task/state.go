package task

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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
	for _, w := range t.Attempts {
		switch {
		case w.Live(now):
			c.Live++
		case w.Expired(now):
			c.Expired++
		case w.State == AttemptSuccess:
			c.Success++
		case w.State == AttemptFail, w.State == AttemptExpired:
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
	for _, w := range t.Attempts {
		if w.Live(now) && (t.NextClaimAt.IsZero() || w.LeaseUntil.Before(t.NextClaimAt)) {
			t.NextClaimAt = w.LeaseUntil
		}
	}
}

// Entry returns the index of h's entry (worker, instance and attempt), or -1.
func (t *Task) Entry(h Holder) int {
	return slices.IndexFunc(t.Attempts, func(w Attempt) bool {
		return w.WorkerID == h.WorkerID && w.Attempt == h.Attempt && w.Instance == h.Instance
	})
}

// Allows reports whether workerID may run t under its pins.
func (t *Task) Allows(workerID string) bool {
	return len(t.SpecificWorkerIDs) == 0 || slices.Contains(t.SpecificWorkerIDs, workerID)
}

// Claim appends who as RUNNING under a fresh lease with the next attempt
// number, records expired entries as failures, and returns the holder of
// the new attempt. The caller has decided the claim (preempt.Decide) and
// writes t with compare-and-set.
func (t *Task) Claim(who Holder, now time.Time) Holder {
	t.Reap(now)
	t.AttemptsStarted++
	t.Attempts = append(t.Attempts, Attempt{
		WorkerID:   who.WorkerID,
		Instance:   who.Instance,
		State:      AttemptRunning,
		Attempt:    t.AttemptsStarted,
		LeaseUntil: now.Add(time.Duration(t.WorkerTimeout)).UTC(),
		StartedAt:  now.UTC(),
		// The store bumps Version by one on the write (as note assumes).
		ClaimVersion: t.Version + 1,
	})
	t.noteWorker(ChangeClaimed, t.Attempts[len(t.Attempts)-1])
	t.touch(now)
	return Holder{TaskKey: t.Key, WorkerID: who.WorkerID, Attempt: t.AttemptsStarted, Instance: who.Instance}
}

// holding returns the index of h's RUNNING entry, or an error wrapping
// ErrLeaseLost that says why it is gone.
func (t *Task) holding(h Holder) (int, error) {
	if t.Cancelled {
		return -1, fmt.Errorf("task %s: %w", t.Key, ErrCancelled)
	}
	if t.State.Finished() {
		// Enough workers succeeded (or too many failed): the rest stop.
		return -1, fmt.Errorf("task %s is %s: %w", t.Key, t.State, ErrTaskDone)
	}
	i := t.Entry(h)
	if i < 0 || t.Attempts[i].State != AttemptRunning {
		return -1, fmt.Errorf("task %s attempt %d: %w", t.Key, h.Attempt, ErrLeaseLost)
	}
	return i, nil
}

// live is holding for writes that need the lease still ahead of now (renew,
// finish): an expired lease is lost even before a peer takes it.
func (t *Task) live(h Holder, now time.Time) (int, error) {
	i, err := t.holding(h)
	if err == nil && !t.Attempts[i].Live(now) {
		return -1, fmt.Errorf("task %s attempt %d: lease expired at %s: %w", t.Key, h.Attempt, t.Attempts[i].LeaseUntil.Format(time.RFC3339Nano), ErrLeaseLost)
	}
	return i, err
}

// Renew extends h's lease to now+WorkerTimeout. It fails with an error
// wrapping ErrLeaseLost when the entry is gone, the task was cancelled, or
// the worker is no longer among the pins (see Unpin).
func (t *Task) Renew(h Holder, now time.Time) error {
	i, err := t.live(h, now)
	if err != nil {
		return err
	}
	if !t.Allows(h.WorkerID) {
		return fmt.Errorf("task %s: %w", t.Key, ErrUnpinned)
	}
	t.Attempts[i].LeaseUntil = now.Add(time.Duration(t.WorkerTimeout)).UTC()
	t.touch(now)
	return nil
}

// Unpin removes h's RUNNING entry when the pins no longer allow its
// worker, so a permitted worker may take over at once without waiting for
// the lease to expire. It reports whether it changed t.
func (t *Task) Unpin(h Holder, now time.Time) bool {
	i := t.Entry(h)
	if t.Allows(h.WorkerID) || i < 0 || t.Attempts[i].State != AttemptRunning {
		return false
	}
	t.noteWorker(ChangeUnpinned, t.Attempts[i])
	t.archive(i, WorkerUnpinned, now)
	t.touch(now)
	return true
}

// Succeed records h's attempt as successful. It is refused with
// ErrLeaseLost unless h still holds a live lease.
func (t *Task) Succeed(h Holder, now time.Time) error {
	i, err := t.live(h, now)
	if err != nil {
		return err
	}
	t.Attempts[i].State, t.Attempts[i].EndedAt = AttemptSuccess, now.UTC()
	t.noteWorker(ChangeSucceeded, t.Attempts[i])
	t.touch(now)
	return nil
}

// Fail records h's attempt as failed with errMsg. When the task may still
// run, its next claim waits until retryAt (retry backoff; zero: at once),
// so every worker honours the delay. It is refused with ErrLeaseLost
// unless h still holds a live lease.
func (t *Task) Fail(h Holder, errMsg string, retryAt, now time.Time) error {
	i, err := t.live(h, now)
	if err != nil {
		return err
	}
	w := &t.Attempts[i]
	w.State, w.EndedAt, w.Error = AttemptFail, now.UTC(), cut(strings.ToValidUTF8(errMsg, "\uFFFD"), MaxErrorLen)
	t.noteWorker(ChangeFailed, *w)
	retryAt = clampTime(retryAt)
	t.Changes[len(t.Changes)-1].Until = retryAt.UTC()
	t.touch(now)
	if !t.State.Finished() && retryAt.After(t.RunAt) {
		t.RunAt = retryAt.UTC()
		t.touch(now)
	}
	return nil
}

// Release removes h's RUNNING entry without counting a failure, so a peer
// can claim at once (graceful shutdown).
func (t *Task) Release(h Holder, now time.Time) error {
	return t.release(h, ChangeReleased, WorkerReleased, now)
}

// release moves h's RUNNING entry to History as st, noting it as op.
func (t *Task) release(h Holder, op string, st AttemptState, now time.Time) error {
	i, err := t.holding(h)
	if errors.Is(err, ErrTaskDone) {
		// Other workers finished it: this one steps out as well.
		if i = t.Entry(h); i >= 0 && t.Attempts[i].State == AttemptRunning {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	t.noteWorker(op, t.Attempts[i])
	t.archive(i, st, now)
	t.touch(now)
	return nil
}

// Cancel marks t cancelled and its running entries CANCELLED; running
// handlers learn it at their next ping.
func (t *Task) Cancel(now time.Time) error {
	if t.State.Finished() {
		return fmt.Errorf("cancel %s: %w (it is %s)", t.Key, ErrFinished, t.State)
	}
	t.Cancelled = true
	t.endRunning(WorkerCancelled, "task cancelled", now)
	t.note(Change{Op: ChangeCancelled})
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
	// Workers still running (stopping at their next ping; a cancel marked
	// them CANCELLED) keep their slot until their leases end: the rerun
	// starts after.
	runAt := now
	for _, w := range t.Attempts {
		if (w.State == AttemptRunning || w.State == WorkerCancelled) && w.LeaseUntil.After(runAt) {
			runAt = w.LeaseUntil
		}
	}
	t.endRunning(WorkerReleased, "task rerun", now)
	t.keep(t.Attempts...)
	t.Attempts = []Attempt{}
	t.Cancelled = false
	if t.RunAt.Before(runAt) {
		t.RunAt = runAt.UTC()
	}
	t.note(Change{Op: ChangeReset, Until: t.RunAt})
	t.touch(now)
	return nil
}

// Reap records expired RUNNING entries as EXPIRED failures (a claim does
// it first; a worker that finds expired workers exhausting the retries
// writes it alone, failing the task). It reports how many it recorded.
func (t *Task) Reap(now time.Time) int {
	n := 0
	for i := range t.Attempts {
		if w := &t.Attempts[i]; w.Expired(now) {
			w.State, w.EndedAt, w.Error = AttemptExpired, now.UTC(), "lease expired"
			t.noteWorker(ChangeExpired, *w)
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

// Snooze gives h's attempt back without counting a failure and delays the
// next claim until until.
func (t *Task) Snooze(h Holder, until, now time.Time) error {
	if err := t.release(h, ChangeSnoozed, WorkerSnoozed, now); err != nil {
		return err
	}
	if until = clampTime(until); until.After(t.RunAt) {
		t.RunAt = until.UTC()
	}
	t.Changes[len(t.Changes)-1].Until = t.RunAt
	t.touch(now)
	return nil
}

// clampTime keeps a time a handler asks for (a snooze, a retry's delay)
// at or before MaxTime, as publish keeps run_at.
func clampTime(t time.Time) time.Time {
	if t.After(MaxTime) {
		return MaxTime
	}
	return t
}
