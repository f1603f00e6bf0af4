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
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// State is where a task key stands in this worker's claim path.
type State uint8

const (
	// Absent: not held here. The table keeps no row for it.
	Absent State = iota
	// Queued: in the heap, due at its claim time.
	Queued
	// RateWaiting: in the heap, due when a rate limit's slot frees
	// as far as this process knows; a control change makes it due at once
	// (the limit may have gone).
	RateWaiting
	// LockWaiting: in the heap, due when another process's hold on
	// its lock keys ends; that holder's finish event wakes the best such
	// task at once (Locks.waiting indexes them by lock key).
	LockWaiting
	// Dispatching: popped from the heap, passing the controls (pauses, rate limits) on
	// its way to a slot; it never outlasts one turn of dispatch.
	Dispatching
	// Paused: due, held out of the heap while a pause covers it.
	Paused
	// Gated: due, held out of the heap while its kind's Gate says it
	// cannot run yet (its device is offline), until the gate's wake or
	// recheck (gate.go).
	Gated
	// LockParked: due, held out of the heap until a lock key busy with
	// an attempt here frees (Locks.parked indexes them by that key, for
	// the heirs an attempt names in its release).
	LockParked
	// Claiming: an attempt is in flight here, from dispatch to its
	// result: its claim, then its run (the run table holds the running
	// attempt's lease, for the events that reach it). The documents that
	// come meanwhile are only noted; the result is weighed against them.
	Claiming
	// Idle: known but not held (finished, not claimable here, or
	// left out for lack of room), kept only while a refill page is read,
	// so that the page's older row of the task does not bring it back.
	Idle
	// RateParked: due, held out of the heap (its entry in its row)
	// behind a claim here counted in one of its rate limits, which go one
	// at a time (RateQueueKey): when that claim is decided the best such
	// task is woken, or, the limit's slots full, all go rate-waiting.
	RateParked
	// LetGo: let go, held nowhere, the store keeping the task unchanged:
	// offered (or dispatched) while the tasks held aside filled their
	// bound and a pause, its gate or a lock key busy here kept it back,
	// or while tasks on one of its lock keys were let go already, so
	// that the key's line keeps its order. The row names its line (the
	// lock key, or LetGoPaused, LetGoGated): the line's freeing drops its
	// rows, and the tasks are read again. Past Config.LetGoRoom rows a
	// task let go keeps none (its line is still marked).
	LetGo
	NumStates
)

// The lines of the tasks let go for a pause or a gate, beside the lock
// keys' lines. A NUL byte starts them, which no lock key holds.
const (
	LetGoPaused = "\x00paused"
	LetGoGated  = "\x00gated"
)

var stateNames = [NumStates]string{
	"absent", "queued", "rate-waiting", "lock-waiting", "dispatching", "paused", "gated", "lock-parked", "claiming", "idle", "rate-parked", "let-go",
}

func (s State) String() string {
	if s < NumStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// InHeap reports whether the heap holds the entries of keys in s.
func (s State) InHeap() bool {
	return s == Queued || s == RateWaiting || s == LockWaiting
}

// Held reports whether keys in s count against the heap's bound.
func (s State) Held() bool {
	return s.InHeap() || s == Paused || s == Gated || s == LockParked || s == RateParked
}

// Aside reports whether s holds a due entry out of the heap (keyState.entry).
func (s State) Aside() bool { return s == Paused || s == Gated }

// transitions are the only moves the table makes. Every state but absent
// may drop its key (to absent, or idle while a page is read): a task
// finished, no longer claimable here, or left out for lack of room.
var transitions = map[State][]State{
	Absent: {Queued, Idle, LetGo},
	Idle:   {Queued, Absent, LetGo},
	// Its line freed (or every line, by the safety net's query), a key
	// let go is dropped; offered again when nothing keeps it back any
	// more, it is queued.
	LetGo: {Queued, Absent, Idle},
	// A key in the heap keeps its state when its entry is replaced (a new
	// document, a wake): the heap orders, the state says who may wake it.
	Queued:      {RateWaiting, LockWaiting, Dispatching, Absent, Idle},
	RateWaiting: {Queued, Dispatching, Absent, Idle},
	LockWaiting: {Queued, Dispatching, Absent, Idle},
	Dispatching: {Paused, Gated, RateWaiting, LockParked, RateParked, Claiming, LetGo, Absent, Idle},
	Paused:      {Queued, Absent, Idle},
	Gated:       {Queued, Absent, Idle},
	LockParked:  {Queued, Absent, Idle},
	RateParked:  {Queued, RateWaiting, Absent, Idle},
	// A result goes back to the heap, or drops the key; rate and lock
	// waits are noted on the queued key after (see onResult).
	Claiming: {Queued, Absent, Idle},
}

var allowed = func() (a [NumStates][NumStates]bool) {
	for from, tos := range transitions {
		for _, to := range tos {
			a[from][to] = true
		}
	}
	return a
}()

// Allowed reports whether the table moves a key from from to to.
func Allowed(from, to State) bool { return from < NumStates && to < NumStates && allowed[from][to] }

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
	// heard (claiming): a document came from an event, query or page
	// since dispatch; the result is weighed against doc then.
	heard    bool
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
	case Claiming:
		k.heard = false
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
// on a key being claimed it is kept for the result (heard).
func (c *Table) See(t *task.Task) bool {
	ok := c.Note(t)
	if k := c.keys[t.Key]; k != nil && k.state == Claiming {
		k.heard = true
	}
	return ok
}

// Heard returns the newest document heard of key since its dispatch, or
// nil when none came (or key is not being claimed).
func (c *Table) Heard(key string) *task.Task {
	if k := c.keys[key]; k != nil && k.state == Claiming && k.heard {
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

// Claim notes an attempt on a dispatched key leaving.
func (c *Table) Claim(key string) { c.move(key, Claiming) }

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
