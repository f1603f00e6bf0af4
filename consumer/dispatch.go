// dispatch.go is the scheduler's hand-off to free slots: the flow
// controls (pauses, rate limits) each due entry passes on its way out.

package consumer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// onControl makes the tasks waiting for a rate limit's slot due now
// (rateGate judges them again under the new limits) and puts back in the
// heap those no pause holds any more; dispatch, which runs next, starts
// them.
func (s *scheduler) onControl() {
	ctl := s.ctl.Load()
	s.tab.Lift(func(t *task.Task) bool { _, paused := ctl.Paused(t); return paused }, s.store.Now())
	if s.pausedOut {
		s.pausedOut = false
		s.tab.FreeLine(claimtab.LetGoPaused)
		s.dropped() // the tasks let go may be free now: read them again
	}
}

// asideFull reports whether the tasks held aside here, paused, gated or
// parked behind a lock key busy here, fill their part of the heap bound,
// half of it: past that such a task is let go (letAside), so that a paused
// backlog, or a long line on one key, never keeps the other tasks out.
func (s *scheduler) asideFull() bool {
	held := s.tab.Count(claimtab.Paused) + s.tab.Count(claimtab.Gated) + s.tab.Count(claimtab.LockParked) + s.tab.Count(claimtab.RateParked)
	return held >= s.cfg.HeapSize/2
}

// letAside lets t, offered and not held here, go, and reports true, when
// the tasks held aside fill their bound and a pause covers t, a lock key
// of its is busy here or its kind's gate keeps it back, or when tasks taking one of its lock keys were
// let go already (so that the key's line keeps its order: those held
// here run first, then the rest as read again). It notes what reads t
// again: the next reload, or the key's freeing (freed); the store keeps
// t, unchanged. start lets go alike the entries it would hold aside. The
// claim table holds the tasks and lines let go (claimtab.LetGo).
func (s *scheduler) letAside(t *task.Task) bool {
	if t == nil {
		return false
	}
	for _, k := range t.LockKeys {
		if s.tab.LineLetGo(k) {
			s.tab.LetGo(t.Key, t, k)
			return true
		}
	}
	if !s.asideFull() {
		return false
	}
	if _, paused := s.ctl.Load().Paused(t); paused {
		s.tab.LetGo(t.Key, t, claimtab.LetGoPaused)
		s.pausedOut = true
		return true
	}
	if k, busy := s.locks.BusyKey(t.LockKeys); busy {
		s.tab.LetGo(t.Key, t, k)
		return true
	}
	if hold, held := s.gateHolds(t); held {
		s.tab.LetGo(t.Key, t, claimtab.LetGoGated)
		s.watchLetGo(hold)
		return true
	}
	return false
}

// freed notes that lock key k is free: released here with no task parked
// on it, or by its holder elsewhere (its finish event). The tasks on k
// let go meanwhile are read again. A claim refused for k's holder
// elsewhere frees nothing: those tasks wait for that holder, or for the
// next query of everything (every line is freed then), and the line does
// not re-read itself with every refused claim.
func (s *scheduler) freed(k string) {
	if s.tab.LineLetGo(k) && !s.locks.HasParked(k) {
		s.tab.FreeLine(k)
		s.dropped()
	}
}

// InstantSlots is how many claims of the instant kinds
// (Config.InstantKinds) run in a lane of their own beside the Concurrency
// slots. Such a task holds its slot for a claim and a write or two, so a
// few serve a burst of timers due at once.
const InstantSlots = 4

// dispatch starts a claim attempt for each due entry of an instant kind
// while the instant lane has room, then for each due entry, of any kind,
// while slots are free. Each attempt gives back, when its handler returns,
// the slot it took (release): a stream of instant tasks, each running
// beside the last, keeps no slot from the other kinds, and the other
// kinds never run more than Concurrency at once.
func (s *scheduler) dispatch(ctx context.Context) {
	for s.lane < InstantSlots {
		e, ok := s.tab.PopInstant(s.store.Now())
		if !ok {
			break
		}
		s.start(ctx, e, true)
	}
	for s.free > 0 {
		e, ok := s.tab.Pop(s.store.Now())
		if !ok {
			return
		}
		s.start(ctx, e, false)
	}
}

// release gives back an attempt's slot: the instant lane's, or one of
// the Concurrency slots.
func (s *scheduler) release(instant bool) {
	if instant {
		s.lane--
	} else {
		s.free++
	}
}

// start starts a claim attempt for a dispatched entry, in the instant
// lane or a slot, unless a pause, its kind's gate, a rate limit or a lock
// key busy here holds it back (aside, or let go: see letAside).
func (s *scheduler) start(ctx context.Context, e preempt.Entry, instant bool) {
	ctl := s.ctl.Load()
	s.fair.popped(e) // groups.go
	if _, paused := ctl.Paused(e.Task); paused {
		if s.asideFull() {
			s.tab.LetGo(e.Key, nil, claimtab.LetGoPaused)
			s.pausedOut = true
			return
		}
		s.tab.Pause(e)
		return
	}
	if s.gated(e) {
		return
	}
	rate, ok := s.rateGate(e, ctl)
	if !ok || !s.concurrencyGate(e, ctl) {
		return
	}
	var keys []string
	if e.Task != nil {
		keys = e.Task.LockKeys
	}
	if k, busy := s.locks.BusyKey(append(rate, keys...)); busy {
		if slices.Contains(keys, k) && s.asideFull() {
			s.tab.LetGo(e.Key, nil, k)
			return
		}
		s.tab.Park(e, k)
		return
	}
	s.locks.Hold(keys)
	s.locks.Hold(rate)
	wakes := s.locks.Depart(keys)
	attempt := s.tab.Claim(e.Key)
	if instant {
		s.lane++
	} else {
		s.free--
	}
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		var once sync.Once
		decided := func() {
			once.Do(func() {
				if len(rate) > 0 {
					select {
					case s.claimsDone <- rate:
					case <-s.done:
					}
				}
			})
		}
		var slotFreed atomic.Bool
		handled := func() {
			slotFreed.Store(true)
			select {
			case s.handled <- instant:
			case <-s.done:
			}
		}
		landed := false // the attempt's own goroutine calls land
		land := func() {
			landed = true
			s.landed.post(e.Key, attempt)
		}
		r := s.attempt(ctx, e, decided, land, handled)
		decided()
		r.busy, r.wakes, r.slotFreed, r.instant = keys, wakes, slotFreed.Load(), instant
		r.attempt, r.landed = attempt, landed
		select {
		case s.results <- r:
		case <-s.done:
		}
	}()
}

// rateGate keeps back a due task whose rate limits have no slot free as
// far as this process knows: it waits in the heap until the earliest slot
// frees, with no store trip. Otherwise it returns the task's rate keys:
// held for the claim's duration, so that claims counted in one limit go
// one at a time here, the best task first when a slot frees.
func (s *scheduler) rateGate(e preempt.Entry, ctl *control.State) ([]string, bool) {
	buckets := ctl.Buckets(e.Task)
	if len(buckets) == 0 {
		return nil, true
	}
	now := s.store.Now()
	rate := make([]string, 0, len(buckets))
	for _, b := range buckets {
		if at, full := s.slots.full(b, now); full {
			// The tasks parked behind this limit's claims wait for the
			// same slot: all go to the heap, where they start in order.
			s.tab.RateFull(rateQueueKey(b), at)
			s.tab.RateWait(e, at)
			return nil, false
		}
		rate = append(rate, rateQueueKey(b))
	}
	return rate, true
}

// rateQueueKey is b's key in the lock queue, where claims counted in b go
// one at a time (claimtab.RateQueueKey).
func rateQueueKey(b control.Bucket) string { return claimtab.RateQueueKey(b.Key) }
