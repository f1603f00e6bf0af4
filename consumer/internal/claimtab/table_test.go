package claimtab

import (
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

const (
	stKey   = "t1"
	stLock  = "dev"
	stOther = "t2" // a second task, parked or waiting beside t1
)

// stRate is a rate limit's queue in the lock queue.
var stRate = RateQueueKey("kind:k")

func stDoc(key string, version int64) *task.Task {
	return &task.Task{Key: key, Kind: "k", Seq: 7, Version: version, State: task.StatePending,
		ConcurrentWorkerCnt: 1, SuccessWorkerCnt: 1, WorkerTimeout: task.Duration(time.Second)}
}

func stEntry(t *task.Task, at time.Time) preempt.Entry {
	return preempt.Entry{Key: t.Key, At: at, Order: at, Seq: t.Seq, Task: t}
}

// newTestTable is a claim table over a heap of room 8 that records the
// moves it refuses instead of panicking.
func newTestTable(t *testing.T) (*Table, *[]string) {
	var refused []string
	tab := New(Config{HeapSize: 8, Locks: NewLocks(), Refused: func(key string, from, to State) {
		refused = append(refused, fmt.Sprintf("%s %s->%s", key, from, to))
	}})
	return tab, &refused
}

// putIn brings stKey (document doc) into s by the table's own moves.
func putIn(t *testing.T, tab *Table, s State, doc *task.Task, now time.Time) {
	t.Helper()
	e := stEntry(doc, now)
	if s == Idle {
		tab.BeginPage()
		tab.Note(doc)
	}
	if s == LetGo {
		tab.LetGo(stKey, doc, stLock)
	}
	if s != Absent && s != Idle && s != LetGo {
		tab.Queue(e)
	}
	switch s {
	case RateWaiting:
		tab.NoteRateWait(stKey)
	case LockWaiting:
		tab.WaitLocks(stKey, []string{stLock})
	case Dispatching, Paused, Gated, LockParked, RateParked, Claiming, Running:
		if _, ok := tab.Pop(now); !ok {
			t.Fatal("nothing due to dispatch")
		}
		switch s {
		case Paused:
			tab.Pause(e)
		case Gated:
			tab.Gate(e)
		case LockParked:
			tab.Park(e, stLock)
		case RateParked:
			tab.Park(e, stRate)
		case Claiming:
			tab.Claim(stKey)
		case Running:
			tab.Land(stKey, tab.Claim(stKey))
		}
	}
	if got := tab.State(stKey); got != s {
		t.Fatalf("putIn %s: the key is %s", s, got)
	}
}

// checkTable fails t when the table disagrees with its indexes; a key
// mid-dispatch is let through its claim first.
func checkTable(t *testing.T, tab *Table) {
	t.Helper()
	if tab.State(stKey) == Dispatching {
		tab.Claim(stKey)
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestClaimTableRefusesUndeclaredMoves: for every pair of states, move
// makes the declared transitions, leaving the state's indexes (heap,
// lock lines) behind, and refuses every other one, the table untouched.
func TestClaimTableRefusesUndeclaredMoves(t *testing.T) {
	now := time.Now()
	for from := range NumStates {
		for to := range NumStates {
			t.Run(fmt.Sprintf("%s-%s", from, to), func(t *testing.T) {
				tab, refused := newTestTable(t)
				putIn(t, tab, from, stDoc(stKey, 1), now)
				_, ok := tab.move(stKey, to)
				if ok != allowed[from][to] {
					t.Fatalf("move accepted %v; declared %v", ok, allowed[from][to])
				}
				want := to
				if !ok {
					want = from
					if len(*refused) != 1 {
						t.Fatalf("refused moves reported: %v; want this one", *refused)
					}
				}
				if got := tab.State(stKey); got != want {
					t.Fatalf("the key is %s; want %s", got, want)
				}
				if to.InHeap() && !from.InHeap() {
					return // entering the heap is its caller's (queueAs)
				}
				if want != Dispatching && want != Idle && !want.InHeap() && tab.heap.Has(stKey) {
					t.Fatalf("%s, and still in the heap", want)
				}
				if want != LockParked && tab.locks.parkedCount() != 0 {
					t.Fatalf("%s, and still parked", want)
				}
				if want != LockWaiting && len(tab.locks.waiting) != 0 {
					t.Fatalf("%s, and still indexed as waiting", want)
				}
				if want != RateParked && len(tab.rateParked) != 0 {
					t.Fatalf("%s, and still rate-parked", want)
				}
				if want != LetGo && tab.letGo[stLock][stKey] {
					t.Fatalf("%s, and still on its let-go line", want)
				}
				if !ok || want == Dispatching {
					checkTable(t, tab)
				}
			})
		}
	}
}

// TestClaimTableTransitions makes every declared transition by the
// method the scheduler makes it with, and checks the table and its
// indexes after; a declared transition without a case here fails.
func TestClaimTableTransitions(t *testing.T) {
	now := time.Now()
	type edge struct{ from, to State }
	dropping := func(tab *Table) { tab.Forget(stKey) }
	paging := func(tab *Table) { tab.BeginPage(); tab.Forget(stKey) }
	ops := map[edge]func(tab *Table){
		{Absent, Queued}: func(tab *Table) { tab.Queue(stEntry(stDoc(stKey, 2), now)) },
		{Absent, Idle}:   func(tab *Table) { tab.BeginPage(); tab.See(stDoc(stKey, 2)) },
		{Idle, Queued}:   func(tab *Table) { tab.Queue(stEntry(stDoc(stKey, 2), now)) },
		{Idle, Absent}:   func(tab *Table) { tab.EndPage() },
		{Absent, LetGo}:  func(tab *Table) { tab.LetGo(stKey, stDoc(stKey, 2), stLock) },
		{Idle, LetGo}:    func(tab *Table) { tab.LetGo(stKey, stDoc(stKey, 2), stLock) },
		{LetGo, Queued}:  func(tab *Table) { tab.Queue(stEntry(stDoc(stKey, 2), now)) },
		{LetGo, Absent}:  func(tab *Table) { tab.FreeLine(stLock) },
		{LetGo, Idle}:    func(tab *Table) { tab.BeginPage(); tab.ClearLetGo() },

		{Queued, RateWaiting}:      func(tab *Table) { tab.NoteRateWait(stKey) },
		{Queued, LockWaiting}:      func(tab *Table) { tab.WaitLocks(stKey, []string{stLock}) },
		{Queued, Dispatching}:      func(tab *Table) { tab.Pop(now) },
		{Queued, Absent}:           dropping,
		{Queued, Idle}:             paging,
		{RateWaiting, Queued}:      func(tab *Table) { tab.Lift(nil, now) },
		{RateWaiting, Dispatching}: func(tab *Table) { tab.Pop(now) },
		{RateWaiting, Absent}:      func(tab *Table) { tab.EvictBelow(1) },
		{RateWaiting, Idle}:        paging,
		{LockWaiting, Queued}:      func(tab *Table) { tab.WakeOne(stLock, now) },
		{LockWaiting, Dispatching}: func(tab *Table) { tab.Pop(now) },
		{LockWaiting, Absent}:      func(tab *Table) { tab.EvictBelow(1) },
		{LockWaiting, Idle}:        paging,

		{Dispatching, Paused}:      func(tab *Table) { tab.Pause(stEntry(stDoc(stKey, 1), now)) },
		{Dispatching, Gated}:       func(tab *Table) { tab.Gate(stEntry(stDoc(stKey, 1), now)) },
		{Dispatching, RateWaiting}: func(tab *Table) { tab.RateWait(stEntry(stDoc(stKey, 1), now), now.Add(time.Hour)) },
		{Dispatching, LockParked}:  func(tab *Table) { tab.Park(stEntry(stDoc(stKey, 1), now), stLock) },
		{Dispatching, RateParked}:  func(tab *Table) { tab.Park(stEntry(stDoc(stKey, 1), now), stRate) },
		{Dispatching, Claiming}:    func(tab *Table) { tab.Claim(stKey) },
		{Dispatching, Absent}:      dropping,
		{Dispatching, Idle}:        paging,
		{Dispatching, LetGo}:       func(tab *Table) { tab.LetGo(stKey, nil, stLock) },

		{Paused, Queued}:          func(tab *Table) { tab.Lift(nil, now) },
		{Paused, Absent}:          dropping,
		{Paused, Idle}:            paging,
		{Gated, Queued}:           func(tab *Table) { tab.Ungate(stKey) },
		{Gated, Absent}:           dropping,
		{Gated, Idle}:             paging,
		{LockParked, Queued}:      func(tab *Table) { tab.WakeOne(stLock, now) },
		{RateParked, Queued}:      func(tab *Table) { tab.WakeOne(stRate, now) },
		{RateParked, RateWaiting}: func(tab *Table) { tab.RateFull(stRate, now.Add(time.Hour)) },
		{RateParked, Absent}:      dropping,
		{RateParked, Idle}:        paging,
		{LockParked, Absent}:      dropping,
		{LockParked, Idle}:        paging,

		{Claiming, Running}: func(tab *Table) { tab.Land(stKey, tab.Attempt(stKey)) },
		{Claiming, Queued}:  func(tab *Table) { tab.Queue(stEntry(stDoc(stKey, 3), now.Add(time.Hour))) },
		{Claiming, Absent}:  dropping,
		{Claiming, Idle}:    paging,
		{Running, Absent}:   dropping,
		{Running, Idle}:     paging,
	}
	for from := range NumStates {
		for to := range NumStates {
			if !allowed[from][to] {
				if _, ok := ops[edge{from, to}]; ok {
					t.Errorf("%s -> %s has a case but is not declared", from, to)
				}
				continue
			}
			op, ok := ops[edge{from, to}]
			if !ok {
				t.Errorf("%s -> %s is declared but has no case", from, to)
				continue
			}
			t.Run(fmt.Sprintf("%s-%s", from, to), func(t *testing.T) {
				tab, refused := newTestTable(t)
				putIn(t, tab, from, stDoc(stKey, 1), now)
				op(tab)
				if got := tab.State(stKey); got != to {
					t.Fatalf("the key is %s; want %s", got, to)
				}
				if len(*refused) > 0 {
					t.Fatalf("refused: %v", *refused)
				}
				if to == LockParked || to == LockWaiting {
					if e, ok := tab.heap.Entry(stKey); to == LockParked && ok {
						t.Fatalf("parked and in the heap at %v", e.At)
					}
				}
				if to == Queued && (from == LockParked || from == RateParked || from == LockWaiting) {
					if e, _ := tab.heap.Entry(stKey); e.At.After(now) {
						t.Fatalf("woken for %v, not now", e.At)
					}
				}
				if to == RateWaiting && from != Queued {
					if e, _ := tab.heap.Entry(stKey); !e.At.Equal(now.Add(time.Hour)) {
						t.Fatalf("rate-waiting until %v; want the slot's time", e.At)
					}
				}
				checkTable(t, tab)
			})
		}
	}
}

// TestClaimTableWakesTheBestWaiter: of two tasks waiting for one lock
// key, a wake takes the one of higher priority and leaves the other
// waiting; the next wake takes it.
func TestClaimTableWakesTheBestWaiter(t *testing.T) {
	now := time.Now()
	for _, line := range []string{"lock-waiting", "lock-parked", "rate-parked"} {
		parked := line != "lock-waiting"
		lock := stLock
		if line == "rate-parked" {
			lock = stRate
		}
		t.Run(line, func(t *testing.T) {
			tab, _ := newTestTable(t)
			low, high := stDoc(stKey, 1), stDoc(stOther, 1)
			high.Priority = 5
			for _, d := range []*task.Task{low, high} {
				e := stEntry(d, now.Add(time.Hour))
				e.Priority = d.Priority
				if parked {
					e.At = now
					tab.Queue(e)
					tab.Pop(now)
					tab.Park(e, lock)
				} else {
					tab.Queue(e)
					tab.WaitLocks(d.Key, []string{stLock})
				}
			}
			checkTable(t, tab)
			tab.WakeOne(lock, now)
			if tab.State(stOther) != Queued {
				t.Fatalf("the high-priority task is %s after the wake", tab.State(stOther))
			}
			waiting := LockWaiting
			if parked {
				waiting = LockParked
			}
			if line == "rate-parked" {
				waiting = RateParked
			}
			if tab.State(stKey) != waiting {
				t.Fatalf("the other task is %s after one wake; want %s", tab.State(stKey), waiting)
			}
			checkTable(t, tab)
			tab.WakeOne(lock, now)
			if tab.State(stKey) != Queued {
				t.Fatalf("the second wake left it %s", tab.State(stKey))
			}
			checkTable(t, tab)
		})
	}
}

// TestLetGoLines: a task let go marks its line; the line stays marked
// while its rows leave for other reasons (the task finished), until it
// frees, which drops its rows; a task let go again moves to its new
// line; past the room a task let go keeps no row, its line marked; and
// the safety net's clear frees every line.
func TestLetGoLines(t *testing.T) {
	tab := New(Config{HeapSize: 8, Locks: NewLocks(), Strict: true, LetGoRoom: 2})
	a, b, c := stDoc("a", 1), stDoc("b", 1), stDoc("c", 1)
	tab.LetGo("a", a, "dev")
	tab.LetGo("b", b, LetGoPaused)
	if !tab.LineLetGo("dev") || tab.LineLetGo("other") || tab.Count(LetGo) != 2 {
		t.Fatalf("lines dev %v, other %v; %d let go", tab.LineLetGo("dev"), tab.LineLetGo("other"), tab.Count(LetGo))
	}
	if tab.Note(stDoc("a", 0)) || tab.Doc("a") != a {
		t.Fatal("an older document replaced a let-go task's")
	}
	tab.LetGo("c", c, "dev") // no room left for its row
	if tab.State("c") != Absent || !tab.LineLetGo("dev") {
		t.Fatalf("past the room: c is %s, the line marked %v", tab.State("c"), tab.LineLetGo("dev"))
	}
	tab.LetGo("b", b, "dev") // the pause's task let go on dev now
	if tab.FreeLine(LetGoPaused) != true || tab.State("b") != LetGo {
		t.Fatalf("freeing the pause's line left b %s", tab.State("b"))
	}
	tab.Forget("a") // finished
	if !tab.LineLetGo("dev") {
		t.Fatal("a row leaving unmarked its line")
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
	if !tab.FreeLine("dev") || tab.FreeLine("dev") || tab.Len() != 0 || tab.LineLetGo("dev") {
		t.Fatalf("after dev freed: %d rows, marked %v", tab.Len(), tab.LineLetGo("dev"))
	}
	tab.LetGo("a", a, "dev")
	tab.LetGo("b", b, LetGoGated)
	tab.ClearLetGo()
	if tab.Len() != 0 || tab.LineLetGo("dev") || tab.Count(LetGo) != 0 {
		t.Fatalf("after the clear: %d rows, dev marked %v", tab.Len(), tab.LineLetGo("dev"))
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestClaimTableLandsOnlyItsAttempt: a landed notice moves the key to
// running only while the attempt it names is the one claiming; a stale
// notice (another attempt's, or one after the result) moves nothing. A
// result finds the key running when its claim landed, claiming when not,
// and anything else is reported.
func TestClaimTableLandsOnlyItsAttempt(t *testing.T) {
	now := time.Now()
	tab := New(Config{HeapSize: 8, Locks: NewLocks(), Strict: true})
	dispatch := func() uint64 {
		t.Helper()
		tab.Queue(stEntry(stDoc(stKey, 1), now))
		if _, ok := tab.Pop(now); !ok {
			t.Fatal("nothing due to dispatch")
		}
		return tab.Claim(stKey)
	}
	first := dispatch()
	if first == 0 || tab.Attempt(stKey) != first {
		t.Fatalf("claim numbered the attempt %d, the row holds %d", first, tab.Attempt(stKey))
	}
	if tab.Land(stKey, first+1) || tab.State(stKey) != Claiming {
		t.Fatalf("another attempt's notice moved the key to %s", tab.State(stKey))
	}
	if err := tab.Result(stKey, first, false); err != nil {
		t.Fatalf("a claim not landed, its key claiming: %v", err)
	}
	if tab.Result(stKey, first, true) == nil {
		t.Fatal("a landed claim's result accepted on a key still claiming")
	}
	if !tab.Land(stKey, first) || tab.State(stKey) != Running {
		t.Fatalf("its own notice left the key %s", tab.State(stKey))
	}
	if err := tab.Result(stKey, first, true); err != nil {
		t.Fatalf("a landed claim, its key running: %v", err)
	}
	if tab.Result(stKey, first, false) == nil || tab.Result(stKey, first+1, true) == nil {
		t.Fatal("a result of a claim not landed, or of another attempt, accepted on a running key")
	}
	tab.Forget(stKey)
	if tab.Land(stKey, first) || tab.State(stKey) != Absent {
		t.Fatalf("a notice after the result moved the key to %s", tab.State(stKey))
	}
	second := dispatch()
	if second == first {
		t.Fatalf("two attempts numbered %d", first)
	}
	if tab.Land(stKey, first) || tab.State(stKey) != Claiming {
		t.Fatalf("the first attempt's notice moved the second's key to %s", tab.State(stKey))
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
}
