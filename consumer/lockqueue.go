package consumer

// The lock-waiting queue: tasks that wait for a lock key, so that the
// holder's release wakes the best waiter (priority, then publish order) at
// once instead of every waiter polling the store.

import (
	"sync"
	"time"

	"github.com/leasepool/leasepool/preempt"
	"github.com/leasepool/leasepool/task"
)

// lockQueue is owned by the scheduler goroutine, but for the parked tasks:
// an attempt releasing a key reads them (heirs), under mu.
type lockQueue struct {
	// waiting maps a lock key held by another process to the tasks here
	// waiting for it (still in the heap, due when that lease ends), so
	// that the holder's finish event wakes the best of them at once.
	waiting map[string]map[string]bool
	// busy counts this worker's attempts holding (or claiming) a lock key;
	// parked holds the tasks that wait for a busy key here, out of the
	// heap, so that a device's queue costs no store round trips.
	busy     map[string]int
	mu       sync.Mutex
	parked   map[string]map[string]preempt.Entry
	parkedBy map[string]string // task key → the lock key it is parked on
	// flights counts, per lock key, the claim attempts in flight on it and
	// the wakes for it since the oldest began: a wake (the holder's finish
	// event) that comes while a claim it stops is in flight finds no
	// waiter, and must not leave that claim waiting for a lease's end.
	flights map[string]*flight
}

type flight struct {
	attempts int
	wakes    uint64
}

func newLockQueue() *lockQueue {
	return &lockQueue{
		waiting:  map[string]map[string]bool{},
		busy:     map[string]int{},
		parked:   map[string]map[string]preempt.Entry{},
		parkedBy: map[string]string{},
		flights:  map[string]*flight{},
	}
}

// Parked is how many tasks are parked here.
func (q *lockQueue) Parked() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.parkedBy)
}

// isParked reports whether the task taskKey is parked here.
func (q *lockQueue) isParked(taskKey string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.parkedBy[taskKey]
	return ok
}

// depart notes a claim attempt on keys leaving and returns the keys' wake
// counts, for landed.
func (q *lockQueue) depart(keys []string) []uint64 {
	wakes := make([]uint64, len(keys))
	for i, k := range keys {
		f := q.flights[k]
		if f == nil {
			f = &flight{}
			q.flights[k] = f
		}
		f.attempts++
		wakes[i] = f.wakes
	}
	return wakes
}

// landed ends an attempt noted by depart and reports whether any of its
// keys was woken meanwhile.
func (q *lockQueue) landed(keys []string, wakes []uint64) bool {
	woken := false
	for i, k := range keys {
		f := q.flights[k]
		if f == nil {
			continue
		}
		woken = woken || f.wakes != wakes[i]
		if f.attempts--; f.attempts == 0 {
			delete(q.flights, k)
		}
	}
	return woken
}

// heirs returns, for each of keys, the best task parked here on it, as a
// place in the key's line lasting two of its leases from now.
func (q *lockQueue) heirs(keys []string, now time.Time) []task.LinePlace {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []task.LinePlace
	for _, k := range keys {
		var best *preempt.Entry
		for _, e := range q.parked[k] {
			if better(e, best) {
				best = &e
			}
		}
		if best == nil {
			continue
		}
		timeout := task.DefaultWorkerTimeout
		if best.Task != nil {
			timeout = time.Duration(best.Task.WorkerTimeout)
		}
		out = append(out, task.LinePlace{LockKey: k, TaskKey: best.Key,
			LockLine: task.LockLine{Priority: best.Priority, Seq: best.Seq, Until: now.Add(2 * timeout)}})
	}
	return out
}

// busyKey returns the first of keys that an attempt here holds.
func (q *lockQueue) busyKey(keys []string) (string, bool) {
	for _, k := range keys {
		if q.busy[k] > 0 {
			return k, true
		}
	}
	return "", false
}

// hold marks keys busy for an attempt starting here.
func (q *lockQueue) hold(keys []string) {
	for _, k := range keys {
		q.busy[k]++
	}
}

// unhold ends an attempt's hold on keys and returns those now free here.
func (q *lockQueue) unhold(keys []string) []string {
	var free []string
	for _, k := range keys {
		if q.busy[k]--; q.busy[k] <= 0 {
			delete(q.busy, k)
			free = append(free, k)
		}
	}
	return free
}

// wait notes that taskKey waits for keys held by another process.
func (q *lockQueue) wait(taskKey string, keys []string) {
	for _, k := range keys {
		if q.waiting[k] == nil {
			q.waiting[k] = map[string]bool{}
		}
		q.waiting[k][taskKey] = true
	}
}

// park moves e out of the heap until its busy lock key is free here.
func (q *lockQueue) park(e preempt.Entry, key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.parked[key] == nil {
		q.parked[key] = map[string]preempt.Entry{}
	}
	q.parked[key][e.Key] = e
	q.parkedBy[e.Key] = key
}

// update keeps the newer document of a parked task; it reports whether
// the task is parked.
func (q *lockQueue) update(e preempt.Entry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	k, ok := q.parkedBy[e.Key]
	if !ok {
		return false
	}
	if cur := q.parked[k][e.Key]; newer(e.Task, cur.Task) {
		cur.Task = e.Task
		q.parked[k][e.Key] = cur
	}
	return true
}

// unpark removes a parked task and returns its entry.
func (q *lockQueue) unpark(taskKey string) (preempt.Entry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.unparkLocked(taskKey)
}

func (q *lockQueue) unparkLocked(taskKey string) (preempt.Entry, bool) {
	k, ok := q.parkedBy[taskKey]
	if !ok {
		return preempt.Entry{}, false
	}
	e := q.parked[k][taskKey]
	delete(q.parked[k], taskKey)
	delete(q.parkedBy, taskKey)
	return e, true
}

// unparkAll removes and returns every task parked on key k.
func (q *lockQueue) unparkAll(k string) []preempt.Entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []preempt.Entry
	for taskKey := range q.parked[k] {
		if e, ok := q.unparkLocked(taskKey); ok {
			out = append(out, e)
		}
	}
	return out
}

// next picks the best task waiting for lock key k: one parked here
// (unparked), else one in heap waiting on another process's lease (no
// longer noted as waiting). Waking one, not all, spares the store a herd
// of failing claims.
func (q *lockQueue) next(k string, heap *preempt.Heap) (preempt.Entry, bool) {
	if f := q.flights[k]; f != nil {
		f.wakes++
	}
	if e, ok := q.nextParked(k); ok {
		return e, true
	}
	var best *preempt.Entry
	for key := range q.waiting[k] {
		if e, ok := heap.Entry(key); ok && better(e, best) {
			best = &e
		}
	}
	if best != nil {
		delete(q.waiting[k], best.Key)
		return *best, true
	}
	return preempt.Entry{}, false
}

// nextParked unparks and returns the best task parked here on k.
func (q *lockQueue) nextParked(k string) (preempt.Entry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var best *preempt.Entry
	for _, e := range q.parked[k] {
		if better(e, best) {
			best = &e
		}
	}
	if best == nil {
		return preempt.Entry{}, false
	}
	q.unparkLocked(best.Key)
	return *best, true
}

// better reports whether e ranks before best (nil: anything does).
func better(e preempt.Entry, best *preempt.Entry) bool {
	return best == nil || e.Priority > best.Priority || (e.Priority == best.Priority && e.Seq < best.Seq)
}
