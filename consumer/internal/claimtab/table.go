// Package claimtab is the scheduler's claim table. Each task key a worker
// holds is in exactly one state of the claim path, with the newest
// document known of it; the table alone moves a key between states, and
// only along the declared transitions. The claim heap and the lock
// queue's lines are its indexes: which keys they hold is decided here.
//
// The table is owned by one goroutine (the scheduler's) and takes no
// lock; the lock queue (Locks) is shared with the attempts and locks
// itself.
package claimtab

import (
	"fmt"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// Table is the scheduler's one record of the task keys it holds. It
// is owned by the scheduler goroutine and takes no lock. The heap and the
// lock queue's indexes order the keys for dispatch and wakes; which keys
// they hold is decided here: every entry in or out of them goes through
// a move.
type Table struct {
	keys   map[string]*keyState
	counts [NumStates]int
	heap   *preempt.Heap
	locks  *Locks
	// paging: a refill page is being read (see Idle); idle lists
	// the keys made idle meanwhile, for endPage.
	paging bool
	idle   []string
	// letGo marks the lines whose tasks were let go (a key present, even
	// with no rows), each with the keys in LetGo on it; letGoRoom bounds
	// those rows.
	letGo     map[string]map[string]bool
	letGoRoom int
	// rateParked indexes the rate-parked keys by their rate queue key.
	rateParked map[string]map[string]bool
	// dropped is called when a key is left out for lack of room.
	dropped func()
	// refused is called for a move not declared in transitions: a bug,
	// the table left as it was. strict panics instead.
	refused func(key string, from, to State)
	strict  bool
	// attempts numbers the attempts dispatched (Claim), so that a notice
	// of one attempt never moves another.
	attempts uint64
}

// Config is what a Table is made of.
type Config struct {
	// HeapSize bounds the claim heap, which the table owns (its index of
	// the keys in the heap); InstantKinds have its instant lane.
	HeapSize     int
	InstantKinds []string
	// Locks is the lock queue, shared with the attempts; its waiting and
	// parked lines are the table's indexes, entered and left only by its
	// moves.
	Locks *Locks
	// Dropped is called when a key is left out for lack of room.
	Dropped func()
	// Refused is called for a move not declared in the transitions: a
	// bug, the table left as it was (nil: ignored). Strict panics
	// instead, as the tests want.
	Refused func(key string, from, to State)
	Strict  bool
	// LetGoRoom is how many keys in LetGo keep a row (0: no bound); past
	// it a task let go is dropped, its line marked all the same.
	LetGoRoom int
}

// keyState is one key's row.
type keyState struct {
	state State
	// doc is the newest document of the task known here, by the one rule
	// of newer: no older document replaces it, in any state.
	doc *task.Task
	// heard (claiming, running): a document came from an event, query or
	// page since dispatch; the result is weighed against doc then.
	heard bool
	// attempt (claiming, running): the number Claim gave the attempt.
	attempt  uint64
	entry    preempt.Entry // paused, gated, rateParked: the entry held aside
	lockKey  string        // lockParked, rateParked: the busy key it is parked on
	line     string        // letGo: the line it was let go on
	waitKeys []string      // lockWaiting: the keys held elsewhere
}

// New returns an empty table over cfg's indexes.
func New(cfg Config) *Table {
	heap := preempt.NewHeap(cfg.HeapSize)
	heap.SetInstant(cfg.InstantKinds)
	c := &Table{keys: map[string]*keyState{}, heap: heap, locks: cfg.Locks, dropped: cfg.Dropped,
		refused: cfg.Refused, strict: cfg.Strict, letGo: map[string]map[string]bool{}, letGoRoom: cfg.LetGoRoom,
		rateParked: map[string]map[string]bool{}}
	if c.dropped == nil {
		c.dropped = func() {}
	}
	if c.refused == nil {
		c.refused = func(string, State, State) {}
	}
	return c
}

// HeapLen is how many keys are in the heap.
func (c *Table) HeapLen() int { return c.heap.Len() }

// Next is when the heap's first entry is due (preempt.Heap.Next).
func (c *Table) Next() (time.Time, bool) { return c.heap.Next() }

// NextInstant is when the instant lane's first entry is due.
func (c *Table) NextInstant() (time.Time, bool) { return c.heap.NextInstant() }

// Entry returns key's entry in the heap.
func (c *Table) Entry(key string) (preempt.Entry, bool) { return c.heap.Entry(key) }

// Len is how many keys the table holds a row for.
func (c *Table) Len() int { return len(c.keys) }

// Count is how many keys are in state s.
func (c *Table) Count(s State) int {
	if s >= NumStates {
		return 0
	}
	return c.counts[s]
}

// Paging reports whether a refill page is being read (see Idle).
func (c *Table) Paging() bool { return c.paging }

// AsideEntry returns the entry held out of the heap for a paused, gated,
// lock-parked or rate-parked key.
func (c *Table) AsideEntry(key string) (preempt.Entry, bool) {
	k := c.keys[key]
	switch {
	case k == nil:
	case k.state == LockParked:
		return c.locks.parkedEntry(k.lockKey, key)
	case k.state.Aside() || k.state == RateParked:
		return k.entry, true
	}
	return preempt.Entry{}, false
}

// State returns key's state.
func (c *Table) State(key string) State {
	if k := c.keys[key]; k != nil {
		return k.state
	}
	return Absent
}

// Doc returns the newest document of key known here (nil: none).
func (c *Table) Doc(key string) *task.Task {
	if k := c.keys[key]; k != nil {
		return k.doc
	}
	return nil
}

// Held is how many keys count against the heap's bound.
func (c *Table) Held() int {
	n := 0
	for s := range NumStates {
		if s.Held() {
			n += c.counts[s]
		}
	}
	return n
}

// move is the one place a key changes state. It refuses a move not in
// transitions, and leaves the indexes of the state left: the heap (when
// the new state is not in it) and the lock queue's waiting and parked
// indexes. Entering a state's index is the caller's (it has the entry).
func (c *Table) move(key string, to State) (*keyState, bool) {
	k := c.keys[key]
	from := Absent
	if k != nil {
		from = k.state
	}
	if !allowed[from][to] {
		c.refuse(key, from, to)
		return k, false
	}
	if k == nil {
		k = &keyState{}
		c.keys[key] = k
	} else {
		c.counts[from]--
	}
	if from.InHeap() && !to.InHeap() {
		c.heap.Remove(key)
	}
	switch from {
	case LockWaiting:
		c.locks.unwait(key, k.waitKeys)
		k.waitKeys = nil
	case LockParked:
		c.locks.unpark(k.lockKey, key)
		k.lockKey = ""
	case RateParked:
		delete(c.rateParked[k.lockKey], key)
		if len(c.rateParked[k.lockKey]) == 0 {
			delete(c.rateParked, k.lockKey)
		}
		k.lockKey, k.entry = "", preempt.Entry{}
	case Paused, Gated:
		k.entry = preempt.Entry{}
	case Claiming, Running:
		if !to.InFlight() {
			k.heard, k.attempt = false, 0
		}
	case LetGo:
		delete(c.letGo[k.line], key) // the line stays marked until it frees
		k.line = ""
	}
	k.state = to
	if to == Absent {
		delete(c.keys, key)
		return nil, true
	}
	if to == Idle {
		c.idle = append(c.idle, key)
	}
	c.counts[to]++
	return k, true
}

// may reports whether key may move to to, reporting the move if not.
func (c *Table) may(key string, to State) bool {
	from := c.State(key)
	if allowed[from][to] {
		return true
	}
	c.refuse(key, from, to)
	return false
}

func (c *Table) refuse(key string, from, to State) {
	if c.strict {
		panic(fmt.Sprintf("claim table: %s moved from %s to %s", key, from, to))
	}
	c.refused(key, from, to)
}

// Note keeps t as its key's newest document unless the one held is
// newer, and reports whether it did (false: t is older than what is
// known, and must not replace it anywhere). While a page is read, an
// unheld key's document is kept too (idle).
func (c *Table) Note(t *task.Task) bool {
	if t == nil {
		return false
	}
	k := c.keys[t.Key]
	if k == nil {
		if c.paging {
			k, _ = c.move(t.Key, Idle)
			k.doc = t
		}
		return true
	}
	if Newer(k.doc, t) {
		return false
	}
	k.doc = t
	return true
}

// See is note for a document heard from a change event, query or page:
// on a key in flight (claiming, running) it is kept for the result
// (heard).
func (c *Table) See(t *task.Task) bool {
	ok := c.Note(t)
	if k := c.keys[t.Key]; k != nil && k.state.InFlight() {
		k.heard = true
	}
	return ok
}

// Heard returns the newest document heard of key since its dispatch, or
// nil when none came (or no attempt on key is in flight).
func (c *Table) Heard(key string) *task.Task {
	if k := c.keys[key]; k != nil && k.state.InFlight() && k.heard {
		return k.doc
	}
	return nil
}

// Forget drops key: to absent, or to idle, keeping its document, while a
// page is read.
func (c *Table) Forget(key string) {
	switch c.State(key) {
	case Absent, Idle:
		return
	}
	if c.paging {
		c.move(key, Idle)
	} else {
		c.move(key, Absent)
	}
}

// Place puts an entry offer computed from its key's newest document: a
// paused or gated key's entry is replaced (dispatch judges it again when
// the pause lifts or the gate wakes it), a parked key keeps its place
// with the new document, any other goes to the heap.
func (c *Table) Place(e preempt.Entry) {
	k := c.keys[e.Key]
	switch {
	case k != nil && k.state.Aside():
		k.entry = e
	case k != nil && k.state == LockParked:
		c.locks.setParkedTask(k.lockKey, e.Task)
	case k != nil && k.state == RateParked:
		k.entry.Task = e.Task
	default:
		c.Queue(e)
	}
}

// Queue puts e in the heap. A key already there keeps its state, its
// entry replaced; any other becomes queued, or is dropped when the heap
// has no room. It reports whether e is in the heap.
func (c *Table) Queue(e preempt.Entry) bool {
	return c.queueAs(e, Queued)
}

func (c *Table) queueAs(e preempt.Entry, to State) bool {
	from := c.State(e.Key)
	if from.InHeap() && (to == Queued || to == from) {
		c.heap.Put(e) // a new entry for a key in the heap: its state stays
		c.keep(c.keys[e.Key], e.Task)
		return true
	}
	if !c.may(e.Key, to) {
		return false
	}
	if !c.heap.Put(e) {
		c.Forget(e.Key)
		c.dropped()
		return false
	}
	k, _ := c.move(e.Key, to)
	c.keep(k, e.Task)
	return true
}

// keep is note on a row the caller holds.
func (c *Table) keep(k *keyState, t *task.Task) {
	if t != nil && !Newer(k.doc, t) {
		k.doc = t
	}
}

// Pop takes the best due entry from the heap for dispatch.
func (c *Table) Pop(now time.Time) (preempt.Entry, bool) {
	e, ok := c.heap.Pop(now)
	if ok {
		c.move(e.Key, Dispatching)
	}
	return e, ok
}

// PopInstant is pop for the entries of the instant kinds alone.
func (c *Table) PopInstant(now time.Time) (preempt.Entry, bool) {
	e, ok := c.heap.PopInstant(now)
	if ok {
		c.move(e.Key, Dispatching)
	}
	return e, ok
}
