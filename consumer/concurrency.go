package consumer

// Concurrency: a limited task holds one of the limit's N slot locks in
// task.LockConcurrency with its lease, taken in the claim (claimRules),
// recorded in its attempt (task.Attempt.Slots), extended by renewals and
// freed once its outcome is written, so a dead worker's slot frees at its
// lease's end and the history never shows more than N running.
// A worker keeps back a due task whose slots it knows taken and wakes it
// when it hears a task of the same limits end. Groups' fair order is in
// groups.go.

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// concurrencyRetry bounds how long a task refused for a full concurrency
// limit waits before it tries again, when no end of a task of the limit
// is heard first (a slot held by a dead worker frees at its lease's end,
// with no event).
const concurrencyRetry = 250 * time.Millisecond

// concurrencyBucket is the slot table's view of a concurrency limit: its
// keys are apart from the rate limits' (a NUL byte no name holds).
func concurrencyBucket(c control.Slots) control.Bucket {
	return control.Bucket{Key: "\x00c:" + c.Key, N: c.N}
}

// concurrencyTableKey is a concurrency slot's key in the slot table.
func concurrencyTableKey(slot string) string { return "\x00c:" + slot }

// concurrencyGate keeps back a due task whose concurrency slots are all
// known taken here: it waits until the first known lease end, or until a
// task of the limit is heard to end (concurrencyEnded), with no store trip.
func (s *scheduler) concurrencyGate(e preempt.Entry, ctl *control.State) bool {
	conc := ctl.Concurrency(e.Task)
	if len(conc) == 0 {
		return true
	}
	now := s.store.Now()
	for _, c := range conc {
		if at, full := s.slots.full(concurrencyBucket(c), now); full {
			s.tab.RateWait(e, earliest(at, now.Add(concurrencyRetry)))
			return false
		}
	}
	return true
}

// concurrencyEnded hears a task's write: the slots of its attempts that
// ended are free now, and as many tasks waiting for those limits here are
// made due.
func (s *scheduler) concurrencyEnded(t *task.Task, now time.Time) {
	var freed map[string]int // limit key → slots freed
	for _, list := range [][]task.Attempt{t.Attempts, t.History} {
		for _, a := range list {
			if len(a.Slots) == 0 || a.Live(now) {
				continue
			}
			for _, k := range a.Slots {
				tk := concurrencyTableKey(k)
				until, known := s.slots.known(tk)
				s.slots.forget([]string{tk})
				// Counted once: while this process knew it taken, or
				// (its own finish forgot it) just after it ended.
				if (known && until.After(now)) || (!a.EndedAt.IsZero() && now.Sub(a.EndedAt) < 2*time.Second) {
					if freed == nil {
						freed = map[string]int{}
					}
					limit, _, _ := strings.Cut(k, "#")
					freed[limit]++
				}
			}
		}
	}
	if len(freed) == 0 || s.tab.Count(claimtab.RateWaiting) == 0 {
		return
	}
	ctl := s.ctl.Load()
	s.tab.WakeWaiting(now, func(e preempt.Entry) bool {
		for _, c := range ctl.Concurrency(e.Task) {
			if freed[c.Key] > 0 {
				freed[c.Key]--
				return true
			}
		}
		return false
	})
}

// takeConcurrency takes one slot of each concurrency limit for holder's
// run until its lease ends (until), and records the slots in the claim's
// attempt entry of t. When a limit has no free slot it takes nothing and
// returns *rateLimited with when to try again.
func (r *claimRules) takeConcurrency(ctx context.Context, conc []control.Slots, t *task.Task, holder task.Holder, now, until time.Time) ([]task.LockParams, error) {
	var held []task.LockParams
	giveBack := func() {
		for _, p := range held {
			r.releaseLocks(p)
			r.forgetSlots(p)
		}
	}
	var keys []string
	for _, c := range conc {
		p, err := r.takeConcurrencySlot(ctx, c, holder, now, until)
		if err != nil {
			giveBack()
			return nil, err
		}
		held = append(held, p)
		keys = append(keys, p.Keys...)
	}
	if i := t.Entry(holder); i >= 0 {
		t.Attempts[i].Slots = keys
		// Started once it holds its slots: the store's time now is after
		// the slot's previous holder wrote its outcome (and ended_at), so
		// the history shows a limit's runs one after another.
		if at := r.store.Now(); at.After(t.Attempts[i].StartedAt) {
			t.Attempts[i].StartedAt = at
		}
	}
	return held, nil
}

func (r *claimRules) takeConcurrencySlot(ctx context.Context, c control.Slots, holder task.Holder, now, until time.Time) (task.LockParams, error) {
	b := concurrencyBucket(c)
	for _, i := range r.slots.free(b, now) {
		p := task.LockParams{Namespace: task.LockConcurrency, Keys: []string{c.SlotKey(i)}, Holder: holder, Now: now, Until: until}
		err := r.store.AcquireLocks(ctx, p)
		var locked *task.LockedError
		switch {
		case err == nil:
			r.slots.note(concurrencyTableKey(p.Keys[0]), until, now)
			return p, nil
		case errors.As(err, &locked):
			// Known taken for a moment only: a holder's slot frees at its
			// finish, long before its lease ends, and a process that
			// hears of no finish (a serve answering remote workers, or a
			// peer's finish through another serve) asks the store again.
			r.slots.note(concurrencyTableKey(p.Keys[0]), earliest(locked.Until, now.Add(concurrencyRetry)), now)
		default:
			return task.LockParams{}, err
		}
	}
	return task.LockParams{}, &rateLimited{bucket: "concurrency " + c.Key, until: earliest(r.slots.earliest(b, now), now.Add(concurrencyRetry))}
}

// forgetSlots drops what the slot table knows of p's keys.
func (r *claimRules) forgetSlots(p task.LockParams) {
	if p.Namespace == task.LockConcurrency {
		keys := make([]string, len(p.Keys))
		for i, k := range p.Keys {
			keys[i] = concurrencyTableKey(k)
		}
		r.slots.forget(keys)
		return
	}
	r.slots.forget(p.Keys)
}

// releaseSlotsAfter frees the concurrency slots of holder's attempt of t
// once its outcome is written: a slot is free only when the store shows
// its attempt over, so the attempt history never shows more running than
// the limit, through crashes included. After a lost lease, or an outcome
// not written, the slots run out at the lease's end instead, since the
// attempt may still run elsewhere (the handler's last side effect).
func (r *claimRules) releaseSlotsAfter(t *task.Task, holder task.Holder, outcome Outcome) {
	switch outcome {
	case OutcomeSucceeded, OutcomeRetried, OutcomeFailed, OutcomeSnoozed, OutcomeReleased, OutcomeCancelled, OutcomeTaskDone:
		r.releaseSlots(t, holder)
	}
}

// releaseSlots frees the concurrency slots of holder's attempt of t.
func (r *claimRules) releaseSlots(t *task.Task, holder task.Holder) {
	if t == nil {
		return
	}
	i := t.Entry(holder)
	if i < 0 || len(t.Attempts[i].Slots) == 0 {
		return
	}
	p := task.LockParams{Namespace: task.LockConcurrency, Keys: t.Attempts[i].Slots, Holder: holder, Now: r.store.Now()}
	r.releaseLocks(p)
	r.forgetSlots(p)
}

// known is when slot frees as last seen here, if known.
func (s *slotTable) known(slot string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.until[slot]
	return u, ok
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
