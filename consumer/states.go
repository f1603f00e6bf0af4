// states.go: the claim table. Each task key this worker holds is in
// exactly one state of the claim path, with the newest document known of
// it; the table alone moves a key between states, and only along the
// declared transitions.

package consumer

import (
	"fmt"
	"slices"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// taskState is where a task key stands in this worker's claim path.
type taskState uint8

const (
	// stateAbsent: not held here. The table keeps no row for it.
	stateAbsent taskState = iota
	// stateQueued: in the heap, due at its claim time.
	stateQueued
	// stateRateWaiting: in the heap, due when a rate limit's slot frees
	// as far as this process knows; a control change makes it due at once
	// (the limit may have gone).
	stateRateWaiting
	// stateLockWaiting: in the heap, due when another process's hold on
	// its lock keys ends; that holder's finish event wakes the best such
	// task at once (lockQueue.waiting indexes them by lock key).
	stateLockWaiting
	// stateDispatching: popped from the heap, passing the controls (pauses, rate limits) on
	// its way to a slot; it never outlasts one turn of dispatch.
	stateDispatching
	// statePaused: due, held out of the heap while a pause covers it.
	statePaused
	// stateGated: due, held out of the heap while its kind's Gate says it
	// cannot run yet (its device is offline), until the gate's wake or
	// recheck (gate.go).
	stateGated
	// stateLockParked: due, held out of the heap until a lock key (or a
	// rate limit's queue) busy with an attempt here frees
	// (lockQueue.parked indexes them by that key).
	stateLockParked
	// stateClaiming: an attempt is in flight here, from dispatch to its
	// result: its claim, then its run (the run table holds the running
	// attempt's lease, for the events that reach it). The documents that
	// come meanwhile are only noted; the result is weighed against them.
	stateClaiming
	// stateIdle: known but not held (finished, not claimable here, or
	// left out for lack of room), kept only while a refill page is read,
	// so that the page's older row of the task does not bring it back.
	stateIdle
	numStates
)

var stateNames = [numStates]string{
	"absent", "queued", "rate-waiting", "lock-waiting", "dispatching", "paused", "gated", "lock-parked", "claiming", "idle",
}

func (s taskState) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("taskState(%d)", uint8(s))
}

// inHeap reports whether the heap holds the entries of keys in s.
func (s taskState) inHeap() bool {
	return s == stateQueued || s == stateRateWaiting || s == stateLockWaiting
}

// held reports whether keys in s count against Config.HeapSize.
func (s taskState) held() bool {
	return s.inHeap() || s == statePaused || s == stateGated || s == stateLockParked
}

// aside reports whether s holds a due entry out of the heap (keyState.entry).
func (s taskState) aside() bool { return s == statePaused || s == stateGated }

// transitions are the only moves the table makes. Every state but absent
// may drop its key (to absent, or idle while a page is read): a task
// finished, no longer claimable here, or left out for lack of room.
var transitions = map[taskState][]taskState{
	stateAbsent: {stateQueued, stateIdle},
	stateIdle:   {stateQueued, stateAbsent},
	// A key in the heap keeps its state when its entry is replaced (a new
	// document, a wake): the heap orders, the state says who may wake it.
	stateQueued:      {stateRateWaiting, stateLockWaiting, stateDispatching, stateAbsent, stateIdle},
	stateRateWaiting: {stateQueued, stateDispatching, stateAbsent, stateIdle},
	stateLockWaiting: {stateQueued, stateDispatching, stateAbsent, stateIdle},
	stateDispatching: {statePaused, stateGated, stateRateWaiting, stateLockParked, stateClaiming, stateAbsent, stateIdle},
	statePaused:      {stateQueued, stateAbsent, stateIdle},
	stateGated:       {stateQueued, stateAbsent, stateIdle},
	stateLockParked:  {stateQueued, stateRateWaiting, stateAbsent, stateIdle},
	// A result goes back to the heap, or drops the key; rate and lock
	// waits are noted on the queued key after (see onResult).
	stateClaiming: {stateQueued, stateAbsent, stateIdle},
}

var allowed = func() (a [numStates][numStates]bool) {
	for from, tos := range transitions {
		for _, to := range tos {
			a[from][to] = true
		}
	}
	return a
}()

// strictStates makes a refused move panic instead of being reported;
// the package's tests set it, so that every scheduler they run checks
// the table after each turn of its loop (claimTable.check).
var strictStates bool

// claimTable is the scheduler's one record of the task keys it holds. It
// is owned by the scheduler goroutine and takes no lock. The heap and the
// lock queue's indexes order the keys for dispatch and wakes; which keys
// they hold is decided here: every entry in or out of them goes through
// a move.
type claimTable struct {
	keys   map[string]*keyState
	counts [numStates]int
	heap   *preempt.Heap
	locks  *lockQueue
	// paging: a refill page is being read (see stateIdle); idle lists
	// the keys made idle meanwhile, for endPage.
	paging bool
	idle   []string
	// dropped is called when a key is left out for lack of room.
	dropped func()
	// refused is called for a move not declared in transitions: a bug,
	// the table left as it was. strict panics instead (strictStates).
	refused func(key string, from, to taskState)
	strict  bool
}

// keyState is one key's row.
type keyState struct {
	state taskState
	// doc is the newest document of the task known here, by the one rule
	// of newer: no older document replaces it, in any state.
	doc *task.Task
	// heard (claiming): a document came from an event, query or page
	// since dispatch; the result is weighed against doc then.
	heard    bool
	entry    preempt.Entry // paused, gated: the entry held aside
	lockKey  string        // lockParked: the busy key it is parked on
	waitKeys []string      // lockWaiting: the keys held elsewhere
}

func newClaimTable(heap *preempt.Heap, locks *lockQueue, dropped func()) *claimTable {
	return &claimTable{keys: map[string]*keyState{}, heap: heap, locks: locks, dropped: dropped,
		refused: func(string, taskState, taskState) {}, strict: strictStates}
}

// state returns key's state.
func (c *claimTable) state(key string) taskState {
	if k := c.keys[key]; k != nil {
		return k.state
	}
	return stateAbsent
}

// doc returns the newest document of key known here (nil: none).
func (c *claimTable) doc(key string) *task.Task {
	if k := c.keys[key]; k != nil {
		return k.doc
	}
	return nil
}

// held is how many keys count against Config.HeapSize.
func (c *claimTable) held() int {
	n := 0
	for s := range numStates {
		if s.held() {
			n += c.counts[s]
		}
	}
	return n
}

// move is the one place a key changes state. It refuses a move not in
// transitions, and leaves the indexes of the state left: the heap (when
// the new state is not in it) and the lock queue's waiting and parked
// indexes. Entering a state's index is the caller's (it has the entry).
func (c *claimTable) move(key string, to taskState) (*keyState, bool) {
	k := c.keys[key]
	from := stateAbsent
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
	if from.inHeap() && !to.inHeap() {
		c.heap.Remove(key)
	}
	switch from {
	case stateLockWaiting:
		c.locks.unwait(key, k.waitKeys)
		k.waitKeys = nil
	case stateLockParked:
		c.locks.unpark(k.lockKey, key)
		k.lockKey = ""
	case statePaused, stateGated:
		k.entry = preempt.Entry{}
	case stateClaiming:
		k.heard = false
	}
	k.state = to
	if to == stateAbsent {
		delete(c.keys, key)
		return nil, true
	}
	if to == stateIdle {
		c.idle = append(c.idle, key)
	}
	c.counts[to]++
	return k, true
}

// may reports whether key may move to to, reporting the move if not.
func (c *claimTable) may(key string, to taskState) bool {
	from := c.state(key)
	if allowed[from][to] {
		return true
	}
	c.refuse(key, from, to)
	return false
}

func (c *claimTable) refuse(key string, from, to taskState) {
	if c.strict {
		panic(fmt.Sprintf("claim table: %s moved from %s to %s", key, from, to))
	}
	c.refused(key, from, to)
}

// note keeps t as its key's newest document unless the one held is
// newer, and reports whether it did (false: t is older than what is
// known, and must not replace it anywhere). While a page is read, an
// unheld key's document is kept too (idle).
func (c *claimTable) note(t *task.Task) bool {
	if t == nil {
		return false
	}
	k := c.keys[t.Key]
	if k == nil {
		if c.paging {
			k, _ = c.move(t.Key, stateIdle)
			k.doc = t
		}
		return true
	}
	if newer(k.doc, t) {
		return false
	}
	k.doc = t
	return true
}

// see is note for a document heard from a change event, query or page:
// on a key being claimed it is kept for the result (heard).
func (c *claimTable) see(t *task.Task) bool {
	ok := c.note(t)
	if k := c.keys[t.Key]; k != nil && k.state == stateClaiming {
		k.heard = true
	}
	return ok
}

// heard returns the newest document heard of key since its dispatch, or
// nil when none came (or key is not being claimed).
func (c *claimTable) heard(key string) *task.Task {
	if k := c.keys[key]; k != nil && k.state == stateClaiming && k.heard {
		return k.doc
	}
	return nil
}

// forget drops key: to absent, or to idle, keeping its document, while a
// page is read.
func (c *claimTable) forget(key string) {
	switch c.state(key) {
	case stateAbsent, stateIdle:
		return
	}
	if c.paging {
		c.move(key, stateIdle)
	} else {
		c.move(key, stateAbsent)
	}
}

// place puts an entry offer computed from its key's newest document: a
// paused or gated key's entry is replaced (dispatch judges it again when
// the pause lifts or the gate wakes it), a parked key keeps its place with the new document, any other
// goes to the heap.
func (c *claimTable) place(e preempt.Entry) {
	k := c.keys[e.Key]
	switch {
	case k != nil && k.state.aside():
		k.entry = e
	case k != nil && k.state == stateLockParked:
		c.locks.setParkedTask(k.lockKey, e.Task)
	default:
		c.queue(e)
	}
}

// queue puts e in the heap. A key already there keeps its state, its
// entry replaced; any other becomes queued, or is dropped when the heap
// has no room. It reports whether e is in the heap.
func (c *claimTable) queue(e preempt.Entry) bool {
	return c.queueAs(e, stateQueued)
}

func (c *claimTable) queueAs(e preempt.Entry, to taskState) bool {
	from := c.state(e.Key)
	if from.inHeap() && (to == stateQueued || to == from) {
		c.heap.Put(e) // a new entry for a key in the heap: its state stays
		c.keep(c.keys[e.Key], e.Task)
		return true
	}
	if !c.may(e.Key, to) {
		return false
	}
	if !c.heap.Put(e) {
		c.forget(e.Key)
		c.dropped()
		return false
	}
	k, _ := c.move(e.Key, to)
	c.keep(k, e.Task)
	return true
}

// keep is note on a row the caller holds.
func (c *claimTable) keep(k *keyState, t *task.Task) {
	if t != nil && !newer(k.doc, t) {
		k.doc = t
	}
}

// pop takes the best due entry from the heap for dispatch.
func (c *claimTable) pop(now time.Time) (preempt.Entry, bool) {
	e, ok := c.heap.Pop(now)
	if ok {
		c.move(e.Key, stateDispatching)
	}
	return e, ok
}

// popInstant is pop for the entries of the instant kinds alone.
func (c *claimTable) popInstant(now time.Time) (preempt.Entry, bool) {
	e, ok := c.heap.PopInstant(now)
	if ok {
		c.move(e.Key, stateDispatching)
	}
	return e, ok
}

// pause holds a dispatched entry aside while a pause covers it.
func (c *claimTable) pause(e preempt.Entry) {
	if k, ok := c.move(e.Key, statePaused); ok {
		k.entry = e
	}
}

// park holds a dispatched entry aside until lockKey, busy here, frees.
func (c *claimTable) park(e preempt.Entry, lockKey string) {
	if !c.may(e.Key, stateLockParked) {
		return
	}
	c.locks.park(e, lockKey)
	k, _ := c.move(e.Key, stateLockParked)
	k.lockKey = lockKey
}

// claim notes an attempt on a dispatched key leaving.
func (c *claimTable) claim(key string) { c.move(key, stateClaiming) }

// rateWait puts a dispatched or parked entry back in the heap, due at at,
// when a rate limit's slot frees.
func (c *claimTable) rateWait(e preempt.Entry, at time.Time) {
	e.At = at
	c.queueAs(e, stateRateWaiting)
}

// noteRateWait marks a queued key as waiting for a rate limit's slot.
func (c *claimTable) noteRateWait(key string) {
	if c.state(key) == stateQueued {
		c.move(key, stateRateWaiting)
	}
}

// waitLocks marks a key in the heap as waiting for lockKeys, held by
// another process.
func (c *claimTable) waitLocks(key string, lockKeys []string) {
	if len(lockKeys) == 0 {
		return
	}
	k := c.keys[key]
	switch {
	case k == nil:
		return
	case k.state == stateQueued:
		k, _ = c.move(key, stateLockWaiting)
	case k.state != stateLockWaiting:
		return
	}
	for _, lk := range lockKeys {
		if !slices.Contains(k.waitKeys, lk) {
			k.waitKeys = append(k.waitKeys, lk)
		}
	}
	c.locks.wait(key, lockKeys)
}

// wake makes e due now: a key in the heap keeps its state, a parked one
// becomes queued.
func (c *claimTable) wake(e preempt.Entry, now time.Time) {
	e.At = now
	if c.state(e.Key).inHeap() {
		c.heap.Put(e)
		return
	}
	c.queue(e)
}

// wakeOne makes the best task waiting for lock key k due now: one parked
// here, else one waiting on another process's lease (no longer waiting
// for k). Waking one, not all, spares the store a herd of failing claims.
func (c *claimTable) wakeOne(k string, now time.Time) {
	c.locks.woke(k)
	if c.wakeParked(k, now) {
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
			c.move(best.Key, stateQueued)
		}
	}
	c.wake(*best, now)
}

// wakeParked makes the best task parked here on k due now.
func (c *claimTable) wakeParked(k string, now time.Time) bool {
	e, ok := c.locks.nextParked(k)
	if ok {
		c.wake(e, now)
	}
	return ok
}

// rateFull puts every task parked behind a rate limit's queue key back in
// the heap, due when the limit's first slot frees.
func (c *claimTable) rateFull(queueKey string, at time.Time) {
	for _, e := range c.locks.parkedOn(queueKey) {
		c.rateWait(e, at)
	}
}

// evictBelow makes room for a task of priority p (preempt.Heap.EvictBelow).
func (c *claimTable) evictBelow(p int) bool {
	e, ok := c.heap.EvictBelow(p)
	if ok {
		c.forget(e.Key)
	}
	return ok
}

// lift makes every rate-waiting key due now (a changed or removed limit
// lets it try again at once) and puts back in the heap the paused keys
// ctl no longer pauses.
func (c *claimTable) lift(ctl *control.State, now time.Time) {
	if c.counts[stateRateWaiting] == 0 && c.counts[statePaused] == 0 {
		return
	}
	for key, k := range c.keys {
		switch k.state {
		case stateRateWaiting:
			if e, ok := c.heap.Entry(key); ok && e.At.After(now) {
				e.At = now
				c.heap.Put(e)
			}
			c.move(key, stateQueued)
		case statePaused:
			if _, still := ctl.Paused(k.entry.Task); !still {
				c.queue(k.entry)
			}
		}
	}
}

// evictLater makes room for a task of priority p claimable at at
// (preempt.Heap.EvictLater).
func (c *claimTable) evictLater(p int, at time.Time) bool {
	e, ok := c.heap.EvictLater(p, at)
	if ok {
		c.forget(e.Key)
	}
	return ok
}

// beginPage and endPage bracket the reading of a refill page (stateIdle).
func (c *claimTable) beginPage() { c.paging = true }

func (c *claimTable) endPage() {
	c.paging = false
	for _, key := range c.idle {
		if c.state(key) == stateIdle {
			c.move(key, stateAbsent)
		}
	}
	c.idle = c.idle[:0]
}
