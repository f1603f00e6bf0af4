package preempt

import (
	"container/heap"
	"slices"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Entry is one task waiting in the claim heap.
type Entry struct {
	Key      string
	At       time.Time // when to try a claim
	Priority int
	Seq      int64
	// Order ranks due entries of one priority: earlier first, then Seq.
	// The consumer sets it to the task's publish time plus this worker's
	// stand-by (see Spread), so that of a backlog each worker takes first
	// the tasks it is preferred for. The zero Order comes first.
	Order time.Time
	Task  *task.Task // the latest document seen, reused by the claim
}

// Heap holds the tasks a worker may claim, bounded in size. Entries wait
// ordered by claim time; once due they move to a ready queue ordered by
// priority (higher first), then publish order. Entries of the instant
// kinds (SetInstant) wait and stand ready in a lane of their own, so that
// PopInstant finds them without looking through the others. Not safe for
// concurrent use: the consumer's scheduler owns it.
type Heap struct {
	max   int
	byKey map[string]*item
	// lanes[0] holds the entries of every kind but the instant ones,
	// lanes[1] those.
	lanes   [2]lane
	instant []string
	// floor is at most the lowest priority held (it may lag below it
	// after removals), so that EvictBelow refuses most tasks unscanned.
	floor int
}

// lane is entries waiting by claim time, then ready by priority.
type lane struct {
	timers timerQueue
	ready  readyQueue
}

type item struct {
	Entry
	index   int
	isReady bool
	lane    int
}

// NewHeap returns a heap holding at most max entries.
func NewHeap(max int) *Heap {
	return &Heap{max: max, byKey: make(map[string]*item)}
}

// SetInstant names the kinds whose entries PopInstant takes: tasks that
// only record that their time came (a flow's timers), which a consumer
// claims even while every slot runs a handler. Call it before Put.
func (h *Heap) SetInstant(kinds []string) { h.instant = kinds }

func (h *Heap) laneOf(e Entry) int {
	if e.Task != nil && slices.Contains(h.instant, e.Task.Kind) {
		return 1
	}
	return 0
}

// Len is the number of entries.
func (h *Heap) Len() int { return len(h.byKey) }

// Full reports whether a new key would be refused.
func (h *Heap) Full() bool { return len(h.byKey) >= h.max }

// Has reports whether key has an entry.
func (h *Heap) Has(key string) bool { _, ok := h.byKey[key]; return ok }

// Put adds or replaces key's entry. It returns false, and keeps nothing,
// when key is new and the heap is full: the caller must re-query later.
func (h *Heap) Put(e Entry) bool {
	if it, ok := h.byKey[e.Key]; ok {
		h.remove(it)
	} else if h.Full() {
		return false
	}
	if len(h.byKey) == 0 || e.Priority < h.floor {
		h.floor = e.Priority
	}
	it := &item{Entry: e, lane: h.laneOf(e)}
	h.byKey[e.Key] = it
	heap.Push(&h.lanes[it.lane].timers, it)
	return true
}

// EvictBelow makes room for a task of priority p in a full heap: it
// removes the entry of the lowest priority below p (the latest published
// among equals) and returns it, or reports false when every entry has
// priority p or higher. The evicted task is still in the store, for the
// caller's next query.
func (h *Heap) EvictBelow(p int) (Entry, bool) {
	if p <= h.floor {
		return Entry{}, false
	}
	var worst *item
	for _, it := range h.byKey {
		if worst == nil || it.Priority < worst.Priority || (it.Priority == worst.Priority && it.Seq > worst.Seq) {
			worst = it
		}
	}
	if worst == nil {
		return Entry{}, false
	}
	h.floor = worst.Priority
	if worst.Priority >= p {
		return Entry{}, false
	}
	h.remove(worst)
	return worst.Entry, true
}

// EvictLater makes room for a task of priority p claimable at at, in a
// full heap that EvictBelow found no room in: it removes the entry of
// priority p due latest, when that is after at, and returns it. A heap
// full of tasks due later (delayed, or leased elsewhere) must not keep a
// task claimable now out.
func (h *Heap) EvictLater(p int, at time.Time) (Entry, bool) {
	var latest *item
	for _, it := range slices.Concat(h.lanes[0].timers, h.lanes[1].timers) {
		if it.Priority <= p && it.At.After(at) && (latest == nil || it.At.After(latest.At)) {
			latest = it
		}
	}
	if latest == nil {
		return Entry{}, false
	}
	h.remove(latest)
	return latest.Entry, true
}

// Remove drops key's entry, if any.
func (h *Heap) Remove(key string) {
	if it, ok := h.byKey[key]; ok {
		h.remove(it)
	}
}

func (h *Heap) remove(it *item) {
	delete(h.byKey, it.Key)
	l := &h.lanes[it.lane]
	if it.isReady {
		heap.Remove(&l.ready, it.index)
	} else {
		heap.Remove(&l.timers, it.index)
	}
}

// Pop removes and returns the best entry due at now: the highest priority,
// then the earliest Order, then the earliest published.
func (h *Heap) Pop(now time.Time) (Entry, bool) {
	h.promote(now)
	best := -1
	for i := range h.lanes {
		if r := h.lanes[i].ready; len(r) > 0 && (best < 0 || readyLess(r[0], h.lanes[best].ready[0])) {
			best = i
		}
	}
	if best < 0 {
		return Entry{}, false
	}
	return h.popReady(best), true
}

// PopInstant removes and returns the best entry of an instant kind due at
// now (SetInstant).
func (h *Heap) PopInstant(now time.Time) (Entry, bool) {
	h.promote(now)
	if len(h.lanes[1].ready) == 0 {
		return Entry{}, false
	}
	return h.popReady(1), true
}

// promote moves the entries due at now to their lane's ready queue.
func (h *Heap) promote(now time.Time) {
	for i := range h.lanes {
		l := &h.lanes[i]
		for len(l.timers) > 0 && !l.timers[0].At.After(now) {
			it := heap.Pop(&l.timers).(*item)
			it.isReady = true
			heap.Push(&l.ready, it)
		}
	}
}

func (h *Heap) popReady(lane int) Entry {
	it := heap.Pop(&h.lanes[lane].ready).(*item)
	delete(h.byKey, it.Key)
	return it.Entry
}

// Next returns when the next entry falls due; ok is false when empty.
func (h *Heap) Next() (at time.Time, ok bool) {
	a, aok := h.lanes[0].next()
	b, bok := h.lanes[1].next()
	if !aok || (bok && b.Before(a)) {
		return b, bok
	}
	return a, true
}

// NextInstant is Next for the entries of the instant kinds alone.
func (h *Heap) NextInstant() (at time.Time, ok bool) { return h.lanes[1].next() }

func (l *lane) next() (at time.Time, ok bool) {
	if len(l.ready) > 0 {
		return time.Time{}, true
	}
	if len(l.timers) > 0 {
		return l.timers[0].At, true
	}
	return time.Time{}, false
}

// Each calls fn for every entry, in no order.
func (h *Heap) Each(fn func(Entry)) {
	for _, it := range h.byKey {
		fn(it.Entry)
	}
}

type timerQueue []*item

func (q timerQueue) Len() int { return len(q) }
func (q timerQueue) Less(i, j int) bool {
	if !q[i].At.Equal(q[j].At) {
		return q[i].At.Before(q[j].At)
	}
	return readyLess(q[i], q[j])
}
func (q timerQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i]; q[i].index = i; q[j].index = j }
func (q *timerQueue) Push(x any)   { it := x.(*item); it.index = len(*q); *q = append(*q, it) }
func (q *timerQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return it
}

type readyQueue []*item

func readyLess(a, b *item) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if !a.Order.Equal(b.Order) {
		return a.Order.Before(b.Order)
	}
	return a.Seq < b.Seq
}

func (q readyQueue) Len() int           { return len(q) }
func (q readyQueue) Less(i, j int) bool { return readyLess(q[i], q[j]) }
func (q readyQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i]; q[i].index = i; q[j].index = j }
func (q *readyQueue) Push(x any)        { it := x.(*item); it.index = len(*q); *q = append(*q, it) }
func (q *readyQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return it
}

// Entry returns key's entry.
func (h *Heap) Entry(key string) (Entry, bool) {
	it, ok := h.byKey[key]
	if !ok {
		return Entry{}, false
	}
	return it.Entry, true
}
