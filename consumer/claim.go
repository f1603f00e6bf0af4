package consumer

// The claim rules a Go worker and a remote one (RemoteWorkers) claim by:
// one decision on the document the claim writes (preempt.Decide), the
// pauses, the rate limits' slots, the concurrency limits' slots (concurrency.go)
// and the lock keys, then the claim in the same compare-and-set.

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// claimRules decide and write claims for one worker identity.
type claimRules struct {
	store task.Store
	self  task.Holder // the worker id and instance claims carry
	// controls is the pauses and limits in force.
	controls func() *control.State
	// slots is what this process knows of the rate limits' slot locks.
	slots *slotTable
	// conflict, if set, hears of each compare-and-set conflict.
	conflict func(kind string)
	logger   *slog.Logger
}

func (r *claimRules) releaseLocks(p task.LockParams) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.store.ReleaseLocks(ctx, p); err != nil {
		r.logger.Warn("release locks; they expire with the lease", slog.Any("keys", p.Keys), slog.Any("err", err))
	}
}

// claimTry is one claim attempt's state across its compare-and-set tries.
type claimTry struct {
	r      *claimRules
	ctx    context.Context
	holder task.Holder
	reaped bool
	held   []task.LockParams // the locks and slots the latest try took

	tries     int       // calls of claim: each after the first follows a conflict
	readyAt   time.Time // since when the task was claimable: see ClaimEvent.Wait
	claimedAt time.Time // the claim's store time
	takenOver int       // expired entries the claim replaced
}

// free gives back what the latest try took: the claim was not written.
func (ct *claimTry) free() {
	for _, p := range ct.held {
		ct.r.releaseLocks(p)
		ct.r.forgetSlots(p)
	}
	ct.held = nil
}

// claim is one try: decide on t, then take its locks and slots and
// write the claim into t.
func (ct *claimTry) claim(t *task.Task) error {
	r := ct.r
	ct.free()
	ct.reaped = false
	if ct.tries++; ct.tries > 1 && r.conflict != nil {
		r.conflict(t.Kind)
	}
	now := r.store.Now()
	d := preempt.Decide(t, r.self.WorkerID, now)
	switch d.Verdict {
	case preempt.Reap:
		t.Reap(now)
		ct.reaped = true
		return nil
	case preempt.Claim:
	default:
		return &notNow{d}
	}
	ctl := r.controls()
	if _, paused := ctl.Paused(t); paused {
		return errPaused
	}
	ct.readyAt, ct.claimedAt, ct.takenOver = t.CreatedAt, now, 0
	if t.RunAt.After(ct.readyAt) {
		ct.readyAt = t.RunAt
	}
	for _, w := range t.Attempts {
		// An expired lease's end is when its task became claimable again.
		if w.Expired(now) {
			ct.takenOver++
			if w.LeaseUntil.After(ct.readyAt) {
				ct.readyAt = w.LeaseUntil
			}
		}
	}
	ct.holder = t.Claim(r.self, now)
	// Slots before locks: a lock taken and given back (no slot) would tell
	// a peer that tried it meanwhile to wait for this claim's whole lease.
	if buckets := ctl.Buckets(t); len(buckets) > 0 {
		slots, err := r.takeSlots(ct.ctx, buckets, ct.holder, now)
		if err != nil {
			return err
		}
		ct.held = append(ct.held, slots...)
	}
	if conc := ctl.Concurrency(t); len(conc) > 0 {
		held, err := r.takeConcurrency(ct.ctx, conc, t, ct.holder, now, t.Attempts[len(t.Attempts)-1].LeaseUntil)
		if err != nil {
			ct.free()
			return err
		}
		ct.held = append(ct.held, held...)
	}
	if len(t.LockKeys) > 0 {
		// In line: across workers the keys go to waiting tasks by
		// priority, then publish order. The place outlasts the retry at
		// the holder's lease end by a lease, and lapses if this worker
		// stops trying.
		line := &task.LockLine{Priority: t.Priority, Seq: t.Seq, Until: now.Add(2 * time.Duration(t.WorkerTimeout))}
		p := task.LockParams{Keys: t.LockKeys, Holder: ct.holder, Now: now, Until: t.Attempts[len(t.Attempts)-1].LeaseUntil, Line: line}
		if err := r.store.AcquireLocks(ct.ctx, p); err != nil {
			ct.free()
			return err
		}
		ct.held = append(ct.held, p)
	}
	return nil
}

// takeSlots takes one slot lock of each bucket for holder's start at now,
// each until now + its period, never released early (unless the claim is
// not written): so no window of that period holds more than N starts,
// cluster-wide. When a bucket has no free slot it takes nothing and
// returns *rateLimited with the time the earliest slot frees.
func (r *claimRules) takeSlots(ctx context.Context, buckets []control.Bucket, holder task.Holder, now time.Time) ([]task.LockParams, error) {
	var held []task.LockParams
	giveBack := func() {
		for _, p := range held {
			r.releaseLocks(p)
			r.slots.forget(p.Keys)
		}
	}
	for _, b := range buckets {
		p, err := r.takeSlot(ctx, b, holder, now)
		if err != nil {
			giveBack()
			return nil, err
		}
		held = append(held, p)
	}
	return held, nil
}

func (r *claimRules) takeSlot(ctx context.Context, b control.Bucket, holder task.Holder, now time.Time) (task.LockParams, error) {
	for _, i := range r.slots.free(b, now) {
		p := task.LockParams{Namespace: task.LockRate, Keys: []string{b.SlotKey(i)}, Holder: holder, Now: now, Until: now.Add(b.Per)}
		err := r.store.AcquireLocks(ctx, p)
		var locked *task.LockedError
		switch {
		case err == nil:
			r.slots.note(p.Keys[0], p.Until, now)
			return p, nil
		case errors.As(err, &locked):
			r.slots.note(p.Keys[0], locked.Until, now)
		default:
			return task.LockParams{}, err
		}
	}
	return task.LockParams{}, &rateLimited{bucket: b.Key, until: r.slots.earliest(b, now)}
}
