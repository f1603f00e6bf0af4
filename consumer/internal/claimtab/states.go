package claimtab

import "fmt"

// The states a task key can be in here and the moves between them.

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
	// Claiming: an attempt is in flight here, dispatched, its claim not
	// known to have landed: its claim's tries, then, when the claim was
	// lost, refused or failed, its result on the way. The documents that
	// come meanwhile are only noted; the result is weighed against them.
	Claiming
	// Running: the attempt's claim landed and its handler runs (then its
	// outcome is written), until its result. The attempt posts a notice
	// of the landing without waiting for the scheduler, which drains the
	// notices at each turn of its loop and before it applies any result:
	// a result finds its key running when the claim landed, claiming when
	// not. The run table holds the running attempt's lease, for the
	// events that reach it; documents are noted as while claiming.
	Running
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
	"absent", "queued", "rate-waiting", "lock-waiting", "dispatching", "paused", "gated", "lock-parked", "claiming", "running", "idle", "rate-parked", "let-go",
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

// InFlight reports whether an attempt on keys in s is in flight here:
// claiming or running. It holds a slot, and no place in the heap.
func (s State) InFlight() bool { return s == Claiming || s == Running }

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
	// The claim landed: the attempt runs. Otherwise its result goes back
	// to the heap, or drops the key; rate and lock waits are noted on the
	// queued key after (see onResult).
	Claiming: {Running, Queued, Absent, Idle},
	// A run's result drops the key (to absent, or idle while a page is
	// read); the scheduler offers it again, by the newest document known,
	// from there. A run asks for no retry: its outcome write says when the
	// task is due again.
	Running: {Absent, Idle},
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
