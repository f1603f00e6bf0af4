package claimtab

// What holds a key out of the heap or makes it due again: pauses, gates,
// lock keys, rate and concurrency slots, and room in the heap.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// Pause holds a dispatched entry aside while a pause covers it.
func (c *Table) Pause(e preempt.Entry) {
	if k, ok := c.move(e.Key, Paused); ok {
		k.entry = e
	}
}

// Park holds a dispatched entry aside until lockKey, busy here, frees:
// lock-parked on a task's lock key, rate-parked on a rate limit's queue
// (RateQueueKey).
func (c *Table) Park(e preempt.Entry, lockKey string) {
	if strings.HasPrefix(lockKey, rateQueuePrefix) {
		if k, ok := c.move(e.Key, RateParked); ok {
			k.lockKey, k.entry = lockKey, e
			if c.rateParked[lockKey] == nil {
				c.rateParked[lockKey] = map[string]bool{}
			}
			c.rateParked[lockKey][e.Key] = true
		}
		return
	}
	if !c.may(e.Key, LockParked) {
		return
	}
	c.locks.park(e, lockKey)
	k, _ := c.move(e.Key, LockParked)
	k.lockKey = lockKey
}

// rateQueuePrefix starts every rate queue key. A NUL byte, which no
// task's lock key holds, so a task may take any lock key, "rate:kind:K"
// too.
const rateQueuePrefix = "\x00rate:"

// RateQueueKey is a rate limit's key (control.Bucket.Key) in the lock
// queue, where the claims here counted in it go one at a time.
func RateQueueKey(bucket string) string { return rateQueuePrefix + bucket }

// Claim notes an attempt on a dispatched key leaving, and returns its
// number, which the attempt's landed notice (Land) and result (Result)
// name it by; 0 when the move was refused.
func (c *Table) Claim(key string) uint64 {
	k, ok := c.move(key, Claiming)
	if !ok {
		return 0
	}
	c.attempts++
	k.attempt = c.attempts
	return k.attempt
}

// Land moves key to running on the notice that attempt's claim landed,
// and reports whether it did. A notice naming another attempt than the
// one in flight on key (a stale one) moves nothing.
func (c *Table) Land(key string, attempt uint64) bool {
	k := c.keys[key]
	if k == nil || k.state != Claiming || k.attempt != attempt || attempt == 0 {
		return false
	}
	_, ok := c.move(key, Running)
	return ok
}

// Attempt returns the number of the attempt in flight on key (0: none).
func (c *Table) Attempt(key string) uint64 {
	if k := c.keys[key]; k != nil {
		return k.attempt
	}
	return 0
}

// Result checks the row an attempt's result is about to be applied to:
// the attempt in flight on key, running when its claim landed (landed),
// claiming when not. The scheduler drains the landed notices first, so
// any other row is a bug; the error says which.
func (c *Table) Result(key string, attempt uint64, landed bool) error {
	want := Claiming
	if landed {
		want = Running
	}
	k := c.keys[key]
	if k == nil || k.state != want || k.attempt != attempt {
		return fmt.Errorf("%s: the result of attempt %d (landed %v) finds the key %s, attempt %d", key, attempt, landed, c.State(key), c.Attempt(key))
	}
	return nil
}

// RateWait puts a dispatched or parked entry back in the heap, due at at,
// when a rate limit's slot frees.
func (c *Table) RateWait(e preempt.Entry, at time.Time) {
	e.At = at
	c.queueAs(e, RateWaiting)
}

// NoteRateWait marks a queued key as waiting for a rate limit's slot.
func (c *Table) NoteRateWait(key string) {
	if c.State(key) == Queued {
		c.move(key, RateWaiting)
	}
}

// WaitLocks marks a key in the heap as waiting for lockKeys, held by
// another process.
func (c *Table) WaitLocks(key string, lockKeys []string) {
	if len(lockKeys) == 0 {
		return
	}
	k := c.keys[key]
	switch {
	case k == nil:
		return
	case k.state == Queued:
		k, _ = c.move(key, LockWaiting)
	case k.state != LockWaiting:
		return
	}
	for _, lk := range lockKeys {
		if !slices.Contains(k.waitKeys, lk) {
			k.waitKeys = append(k.waitKeys, lk)
		}
	}
	c.locks.wait(key, lockKeys)
}

// Wake makes e due now: a key in the heap keeps its state, a parked one
// becomes queued.
func (c *Table) Wake(e preempt.Entry, now time.Time) {
	e.At = now
	if c.State(e.Key).InHeap() {
		c.heap.Put(e)
		return
	}
	c.Queue(e)
}

// WakeOne makes the best task waiting for lock key k due now: one parked
// here, else one waiting on another process's lease (no longer waiting
// for k). Waking one, not all, spares the store a herd of failing claims.
func (c *Table) WakeOne(k string, now time.Time) {
	c.locks.woke(k)
	if c.WakeParked(k, now) {
		return
	}
	var best *preempt.Entry
	for _, key := range c.locks.waiters(k) {
		if e, ok := c.heap.Entry(key); ok && better(e, best) {
			best = &e
		}
	}
	if best == nil {
		return
	}
	c.locks.unwait(best.Key, []string{k})
	if row := c.keys[best.Key]; row != nil {
		row.waitKeys = slices.DeleteFunc(row.waitKeys, func(w string) bool { return w == k })
		if len(row.waitKeys) == 0 {
			c.move(best.Key, Queued)
		}
	}
	c.Wake(*best, now)
}

// WakeParked makes the best task parked here on k (a lock key or a rate
// queue key) due now.
func (c *Table) WakeParked(k string, now time.Time) bool {
	e, ok := c.ratePark(k)
	if !ok {
		e, ok = c.locks.nextParked(k)
	}
	if ok {
		c.Wake(e, now)
	}
	return ok
}

// ratePark returns the best entry rate-parked on queueKey.
func (c *Table) ratePark(queueKey string) (preempt.Entry, bool) {
	var best *preempt.Entry
	for key := range c.rateParked[queueKey] {
		if e := c.keys[key].entry; better(e, best) {
			best = &e
		}
	}
	if best == nil {
		return preempt.Entry{}, false
	}
	return *best, true
}

// RateFull puts every task parked behind a rate limit's queue key back in
// the heap, due when the limit's first slot frees.
func (c *Table) RateFull(queueKey string, at time.Time) {
	for key := range c.rateParked[queueKey] {
		c.RateWait(c.keys[key].entry, at)
	}
}

// EvictBelow makes room for a task of priority p (preempt.Heap.EvictBelow).
func (c *Table) EvictBelow(p int) bool {
	e, ok := c.heap.EvictBelow(p)
	if ok {
		c.Forget(e.Key)
	}
	return ok
}

// Lift makes every rate-waiting key due now (a changed or removed limit
// lets it try again at once) and puts back in the heap the paused keys
// that paused no longer reports paused (nil: none is).
func (c *Table) Lift(paused func(*task.Task) bool, now time.Time) {
	if c.counts[RateWaiting] == 0 && c.counts[Paused] == 0 {
		return
	}
	for key, k := range c.keys {
		switch k.state {
		case RateWaiting:
			if e, ok := c.heap.Entry(key); ok && e.At.After(now) {
				e.At = now
				c.heap.Put(e)
			}
			c.move(key, Queued)
		case Paused:
			if paused == nil || !paused(k.entry.Task) {
				c.Queue(k.entry)
			}
		}
	}
}

// EvictOrderAfter makes room for a grouped task of priority p ordered at
// order (preempt.Heap.EvictOrderAfter).
func (c *Table) EvictOrderAfter(p int, order time.Time) bool {
	e, ok := c.heap.EvictOrderAfter(p, order)
	if ok {
		c.Forget(e.Key)
	}
	return ok
}

// EachQueued calls fn with every entry in the heap; fn must not change
// the table.
func (c *Table) EachQueued(fn func(preempt.Entry)) { c.heap.Each(fn) }

// WakeWaiting makes due now the rate-waiting entries wake picks, best
// first.
func (c *Table) WakeWaiting(now time.Time, wake func(preempt.Entry) bool) {
	var waiting []preempt.Entry
	for key, k := range c.keys {
		if k.state != RateWaiting {
			continue
		}
		if e, ok := c.heap.Entry(key); ok && e.At.After(now) {
			waiting = append(waiting, e)
		}
	}
	slices.SortFunc(waiting, func(a, b preempt.Entry) int {
		if better(a, &b) {
			return -1
		}
		return 1
	})
	for _, e := range waiting {
		if wake(e) {
			e.At = now
			c.heap.Put(e)
		}
	}
}

// EvictLater makes room for a task of priority p claimable at at
// (preempt.Heap.EvictLater).
func (c *Table) EvictLater(p int, at time.Time) bool {
	e, ok := c.heap.EvictLater(p, at)
	if ok {
		c.Forget(e.Key)
	}
	return ok
}

// BeginPage and EndPage bracket the reading of a refill page (Idle).
func (c *Table) BeginPage() { c.paging = true }

func (c *Table) EndPage() {
	c.paging = false
	for _, key := range c.idle {
		if c.State(key) == Idle {
			c.move(key, Absent)
		}
	}
	c.idle = c.idle[:0]
}

// Gate holds a dispatched entry aside while its kind's Gate keeps it back.
func (c *Table) Gate(e preempt.Entry) {
	if k, ok := c.move(e.Key, Gated); ok {
		k.entry = e
	}
}

// Ungate puts a gated key's entry back in the heap, where dispatch asks
// the gate again; a key in any other state is left alone (its wake came
// late).
func (c *Table) Ungate(key string) {
	if k := c.keys[key]; k != nil && k.state == Gated {
		c.Queue(k.entry)
	}
}

// LetGo lets key go on line (a lock key of its, LetGoPaused or
// LetGoGated), with t its newest document if not nil, and marks the line
// let go. A key let go already moves to the new line.
func (c *Table) LetGo(key string, t *task.Task, line string) {
	if c.letGo[line] == nil {
		c.letGo[line] = map[string]bool{}
	}
	k := c.keys[key]
	switch {
	case k != nil && k.state == LetGo:
		delete(c.letGo[k.line], key)
	case !c.may(key, LetGo):
		return
	case c.letGoRoom > 0 && c.Count(LetGo) >= c.letGoRoom:
		c.Forget(key) // no room for the row: the line's mark reads it again
		return
	default:
		k, _ = c.move(key, LetGo)
	}
	k.line = line
	c.letGo[line][key] = true
	if t != nil {
		c.keep(k, t)
	}
}

// LineLetGo reports whether lock key k's line is let go: tasks taking k
// were let go and are not read again until it frees.
func (c *Table) LineLetGo(k string) bool {
	_, ok := c.letGo[k]
	return ok
}

// FreeLine ends line's let-go (its key freed, or the pause or gate that
// kept its tasks back may have lifted), dropping its rows, and reports
// whether it was let go: if so its tasks are to be read again.
func (c *Table) FreeLine(line string) bool {
	keys, ok := c.letGo[line]
	if !ok {
		return false
	}
	delete(c.letGo, line)
	for key := range keys {
		c.Forget(key)
	}
	return true
}

// ClearLetGo ends every line's let-go (the next query reads everything:
// a finish event missed must not hold a line for good).
func (c *Table) ClearLetGo() {
	for line := range c.letGo {
		c.FreeLine(line)
	}
}
