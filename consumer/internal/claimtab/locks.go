package claimtab

// The lock-waiting queue: tasks that wait for a lock key, so that the
// holder's release wakes the best waiter (priority, then publish order) at
// once instead of every waiter polling the store.

import (
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// Locks holds the lock side of the claim path: the keys busy with an
// attempt here, the claims in flight on each key, and two indexes the
// claim table keeps (which task is in which state is the table's to say;
// these say which lock key each waits on, for the wakes).
//
// Every method takes mu. The scheduler goroutine calls all of them, and
// an attempt releasing its locks calls heirs from its own goroutine; one
// lock over the whole queue means no map is ever read while another
// goroutine writes it, whichever method a later change calls from where.
type Locks struct {
	mu sync.Mutex
	// waiting maps a lock key held by another process to the tasks here
	// waiting for it (in the heap, due when that lease ends, in the
	// table's lockWaiting state), so that the holder's finish event wakes
	// the best of them at once.
	waiting map[string]map[string]bool
	// busy counts this worker's attempts holding (or claiming) a lock key;
	// parked holds the tasks that wait for a busy key here, out of the
	// heap (the table's lockParked state), so that a device's queue costs
	// no store round trips.
	busy   map[string]int
	parked map[string]map[string]preempt.Entry
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

// NewLocks returns an empty lock queue.
func NewLocks() *Locks {
	return &Locks{
		waiting: map[string]map[string]bool{},
		busy:    map[string]int{},
		parked:  map[string]map[string]preempt.Entry{},
		flights: map[string]*flight{},
	}
}

// Depart notes a claim attempt on keys leaving and returns the keys' wake
// counts, for landed.
func (q *Locks) Depart(keys []string) []uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
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

// Landed ends an attempt noted by depart and reports whether any of its
// keys was woken meanwhile.
func (q *Locks) Landed(keys []string, wakes []uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
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

// woke counts a wake of lock key k for the attempts in flight on it.
func (q *Locks) woke(k string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if f := q.flights[k]; f != nil {
		f.wakes++
	}
}

// Heirs returns, for each of keys, the best task parked here on it, as a
// place in the key's line lasting two of its leases from now.
func (q *Locks) Heirs(keys []string, now time.Time) []task.LinePlace {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []task.LinePlace
	for _, k := range keys {
		best, ok := bestOf(q.parked[k])
		if !ok {
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

// BusyKey returns the first of keys that an attempt here holds.
func (q *Locks) BusyKey(keys []string) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		if q.busy[k] > 0 {
			return k, true
		}
	}
	return "", false
}

// Hold marks keys busy for an attempt starting here.
func (q *Locks) Hold(keys []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		q.busy[k]++
	}
}

// Unhold ends an attempt's hold on keys and returns those now free here.
func (q *Locks) Unhold(keys []string) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var free []string
	for _, k := range keys {
		if q.busy[k]--; q.busy[k] <= 0 {
			delete(q.busy, k)
			free = append(free, k)
		}
	}
	return free
}

// wait indexes taskKey as waiting for keys, held by another process.
func (q *Locks) wait(taskKey string, keys []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		if q.waiting[k] == nil {
			q.waiting[k] = map[string]bool{}
		}
		q.waiting[k][taskKey] = true
	}
}

// unwait drops taskKey from the waiters of keys.
func (q *Locks) unwait(taskKey string, keys []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		delete(q.waiting[k], taskKey)
		if len(q.waiting[k]) == 0 {
			delete(q.waiting, k)
		}
	}
}

// waiters returns the tasks indexed as waiting for k.
func (q *Locks) waiters(k string) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]string, 0, len(q.waiting[k]))
	for taskKey := range q.waiting[k] {
		out = append(out, taskKey)
	}
	return out
}

// park indexes e as waiting for key, busy with an attempt here.
func (q *Locks) park(e preempt.Entry, key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.parked[key] == nil {
		q.parked[key] = map[string]preempt.Entry{}
	}
	q.parked[key][e.Key] = e
}

// setParkedTask replaces the document of a task parked on key (the
// claim table decided it is the newer).
func (q *Locks) setParkedTask(key string, t *task.Task) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.parked[key][t.Key]; ok {
		e.Task = t
		q.parked[key][t.Key] = e
	}
}

// unpark drops taskKey from the tasks parked on key.
func (q *Locks) unpark(key, taskKey string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.unparkLocked(key, taskKey)
}

func (q *Locks) unparkLocked(key, taskKey string) {
	delete(q.parked[key], taskKey)
	if len(q.parked[key]) == 0 {
		delete(q.parked, key)
	}
}

// parkedEntry returns taskKey's entry parked on key.
func (q *Locks) parkedEntry(key, taskKey string) (preempt.Entry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, ok := q.parked[key][taskKey]
	return e, ok
}

// nextParked returns the best task parked on key and drops it from the
// index.
func (q *Locks) nextParked(key string) (preempt.Entry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	best, ok := bestOf(q.parked[key])
	if ok {
		q.unparkLocked(key, best.Key)
	}
	return best, ok
}

// HasParked reports whether a task is parked on key.
func (q *Locks) HasParked(key string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.parked[key]) > 0
}

// parkedCount is how many tasks the parked index holds.
func (q *Locks) parkedCount() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, m := range q.parked {
		n += len(m)
	}
	return n
}

// bestOf returns the entry of m ranking first (better).
func bestOf(m map[string]preempt.Entry) (preempt.Entry, bool) {
	var best *preempt.Entry
	for _, e := range m {
		if better(e, best) {
			best = &e
		}
	}
	if best == nil {
		return preempt.Entry{}, false
	}
	return *best, true
}

// better reports whether e ranks before best (nil: anything does).
func better(e preempt.Entry, best *preempt.Entry) bool {
	return best == nil || e.Priority > best.Priority || (e.Priority == best.Priority && e.Seq < best.Seq)
}
