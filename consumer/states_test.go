package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// Every scheduler this package's tests run checks its claim table after
// each turn of its loop, and panics on a move not declared.
func init() { strictStates = true }

const (
	stKey   = "t1"
	stLock  = "dev"
	stOther = "t2" // a second task, parked or waiting beside t1
)

func stDoc(key string, version int64) *task.Task {
	return &task.Task{Key: key, Kind: "k", Seq: 7, Version: version, State: task.StatePending,
		ConcurrentWorkerCnt: 1, SuccessWorkerCnt: 1, WorkerTimeout: task.Duration(time.Second)}
}

func stEntry(t *task.Task, at time.Time) preempt.Entry {
	return preempt.Entry{Key: t.Key, At: at, Order: at, Seq: t.Seq, Task: t}
}

// newTestTable is a claim table over a heap of room 8 that records the
// moves it refuses instead of panicking.
func newTestTable(t *testing.T) (*claimTable, *[]string) {
	var refused []string
	tab := newClaimTable(preempt.NewHeap(8), newLockQueue(), func() {})
	tab.strict = false
	tab.refused = func(key string, from, to taskState) {
		refused = append(refused, fmt.Sprintf("%s %s->%s", key, from, to))
	}
	return tab, &refused
}

// putIn brings stKey (document doc) into s by the table's own moves.
func putIn(t *testing.T, tab *claimTable, s taskState, doc *task.Task, now time.Time) {
	t.Helper()
	e := stEntry(doc, now)
	if s == stateIdle {
		tab.beginPage()
		tab.note(doc)
	}
	if s != stateAbsent && s != stateIdle {
		tab.queue(e)
	}
	switch s {
	case stateRateWaiting:
		tab.noteRateWait(stKey)
	case stateLockWaiting:
		tab.waitLocks(stKey, []string{stLock})
	case stateDispatching, statePaused, stateGated, stateLockParked, stateClaiming:
		if _, ok := tab.pop(now); !ok {
			t.Fatal("nothing due to dispatch")
		}
		switch s {
		case statePaused:
			tab.pause(e)
		case stateGated:
			tab.gate(e)
		case stateLockParked:
			tab.park(e, stLock)
		case stateClaiming:
			tab.claim(stKey)
		}
	}
	if got := tab.state(stKey); got != s {
		t.Fatalf("putIn %s: the key is %s", s, got)
	}
}

// checkTable fails t when the table disagrees with its indexes; a key
// mid-dispatch is let through its claim first.
func checkTable(t *testing.T, tab *claimTable) {
	t.Helper()
	if tab.state(stKey) == stateDispatching {
		tab.claim(stKey)
	}
	if err := tab.check(); err != nil {
		t.Fatal(err)
	}
}

// TestClaimTableRefusesUndeclaredMoves: for every pair of states, move
// makes the declared transitions, leaving the state's indexes (heap,
// lock lines) behind, and refuses every other one, the table untouched.
func TestClaimTableRefusesUndeclaredMoves(t *testing.T) {
	now := time.Now()
	for from := range numStates {
		for to := range numStates {
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
				if got := tab.state(stKey); got != want {
					t.Fatalf("the key is %s; want %s", got, want)
				}
				if to.inHeap() && !from.inHeap() {
					return // entering the heap is its caller's (queueAs)
				}
				if want != stateDispatching && want != stateIdle && !want.inHeap() && tab.heap.Has(stKey) {
					t.Fatalf("%s, and still in the heap", want)
				}
				if want != stateLockParked && tab.locks.parkedCount() != 0 {
					t.Fatalf("%s, and still parked", want)
				}
				if want != stateLockWaiting && len(tab.locks.waiting) != 0 {
					t.Fatalf("%s, and still indexed as waiting", want)
				}
				if !ok || want == stateDispatching {
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
	type edge struct{ from, to taskState }
	dropping := func(tab *claimTable) { tab.forget(stKey) }
	paging := func(tab *claimTable) { tab.beginPage(); tab.forget(stKey) }
	ops := map[edge]func(tab *claimTable){
		{stateAbsent, stateQueued}: func(tab *claimTable) { tab.queue(stEntry(stDoc(stKey, 2), now)) },
		{stateAbsent, stateIdle}:   func(tab *claimTable) { tab.beginPage(); tab.see(stDoc(stKey, 2)) },
		{stateIdle, stateQueued}:   func(tab *claimTable) { tab.queue(stEntry(stDoc(stKey, 2), now)) },
		{stateIdle, stateAbsent}:   func(tab *claimTable) { tab.endPage() },

		{stateQueued, stateRateWaiting}:      func(tab *claimTable) { tab.noteRateWait(stKey) },
		{stateQueued, stateLockWaiting}:      func(tab *claimTable) { tab.waitLocks(stKey, []string{stLock}) },
		{stateQueued, stateDispatching}:      func(tab *claimTable) { tab.pop(now) },
		{stateQueued, stateAbsent}:           dropping,
		{stateQueued, stateIdle}:             paging,
		{stateRateWaiting, stateQueued}:      func(tab *claimTable) { tab.lift(nil, now) },
		{stateRateWaiting, stateDispatching}: func(tab *claimTable) { tab.pop(now) },
		{stateRateWaiting, stateAbsent}:      func(tab *claimTable) { tab.evictBelow(1) },
		{stateRateWaiting, stateIdle}:        paging,
		{stateLockWaiting, stateQueued}:      func(tab *claimTable) { tab.wakeOne(stLock, now) },
		{stateLockWaiting, stateDispatching}: func(tab *claimTable) { tab.pop(now) },
		{stateLockWaiting, stateAbsent}:      func(tab *claimTable) { tab.evictBelow(1) },
		{stateLockWaiting, stateIdle}:        paging,

		{stateDispatching, statePaused}:      func(tab *claimTable) { tab.pause(stEntry(stDoc(stKey, 1), now)) },
		{stateDispatching, stateGated}:       func(tab *claimTable) { tab.gate(stEntry(stDoc(stKey, 1), now)) },
		{stateDispatching, stateRateWaiting}: func(tab *claimTable) { tab.rateWait(stEntry(stDoc(stKey, 1), now), now.Add(time.Hour)) },
		{stateDispatching, stateLockParked}:  func(tab *claimTable) { tab.park(stEntry(stDoc(stKey, 1), now), stLock) },
		{stateDispatching, stateClaiming}:    func(tab *claimTable) { tab.claim(stKey) },
		{stateDispatching, stateAbsent}:      dropping,
		{stateDispatching, stateIdle}:        paging,

		{statePaused, stateQueued}:          func(tab *claimTable) { tab.lift(nil, now) },
		{statePaused, stateAbsent}:          dropping,
		{statePaused, stateIdle}:            paging,
		{stateGated, stateQueued}:           func(tab *claimTable) { tab.ungate(stKey) },
		{stateGated, stateAbsent}:           dropping,
		{stateGated, stateIdle}:             paging,
		{stateLockParked, stateQueued}:      func(tab *claimTable) { tab.wakeOne(stLock, now) },
		{stateLockParked, stateRateWaiting}: func(tab *claimTable) { tab.rateFull(stLock, now.Add(time.Hour)) },
		{stateLockParked, stateAbsent}:      dropping,
		{stateLockParked, stateIdle}:        paging,

		{stateClaiming, stateQueued}: func(tab *claimTable) { tab.queue(stEntry(stDoc(stKey, 3), now.Add(time.Hour))) },
		{stateClaiming, stateAbsent}: dropping,
		{stateClaiming, stateIdle}:   paging,
	}
	for from := range numStates {
		for to := range numStates {
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
				if got := tab.state(stKey); got != to {
					t.Fatalf("the key is %s; want %s", got, to)
				}
				if len(*refused) > 0 {
					t.Fatalf("refused: %v", *refused)
				}
				if to == stateLockParked || to == stateLockWaiting {
					if e, ok := tab.heap.Entry(stKey); to == stateLockParked && ok {
						t.Fatalf("parked and in the heap at %v", e.At)
					}
				}
				if to == stateQueued && (from == stateLockParked || from == stateLockWaiting) {
					if e, _ := tab.heap.Entry(stKey); e.At.After(now) {
						t.Fatalf("woken for %v, not now", e.At)
					}
				}
				if to == stateRateWaiting && from != stateQueued {
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
	for _, parked := range []bool{false, true} {
		t.Run(fmt.Sprintf("parked=%v", parked), func(t *testing.T) {
			tab, _ := newTestTable(t)
			low, high := stDoc(stKey, 1), stDoc(stOther, 1)
			high.Priority = 5
			for _, d := range []*task.Task{low, high} {
				e := stEntry(d, now.Add(time.Hour))
				e.Priority = d.Priority
				if parked {
					e.At = now
					tab.queue(e)
					tab.pop(now)
					tab.park(e, stLock)
				} else {
					tab.queue(e)
					tab.waitLocks(d.Key, []string{stLock})
				}
			}
			checkTable(t, tab)
			tab.wakeOne(stLock, now)
			if tab.state(stOther) != stateQueued {
				t.Fatalf("the high-priority task is %s after the wake", tab.state(stOther))
			}
			waiting := stateLockWaiting
			if parked {
				waiting = stateLockParked
			}
			if tab.state(stKey) != waiting {
				t.Fatalf("the other task is %s after one wake; want %s", tab.state(stKey), waiting)
			}
			checkTable(t, tab)
			tab.wakeOne(stLock, now)
			if tab.state(stKey) != stateQueued {
				t.Fatalf("the second wake left it %s", tab.state(stKey))
			}
			checkTable(t, tab)
		})
	}
}

// newTestScheduler is a scheduler of a consumer on an in-memory store,
// never started: its methods are called directly.
func newTestScheduler(t *testing.T) *scheduler {
	t.Helper()
	c, err := New(Config{Store: memstore.New(memstore.Config{}).Open(), WorkerID: "w1",
		Handler: HandlerFunc(func(context.Context, *Job) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	s := c.newScheduler()
	s.tab.strict = false
	s.tab.refused = func(key string, from, to taskState) { t.Errorf("refused: %s %s -> %s", key, from, to) }
	return s
}

// TestOlderDocumentNeverReplacesNewer: in every state, a change event,
// query or page row of an older document than the one held leaves the
// table's document and the state's own entry (heap, pause, lock line) as
// they were; and an attempt's retry decided on an older document than one
// heard meanwhile does not replace it.
func TestOlderDocumentNeverReplacesNewer(t *testing.T) {
	for s := range numStates {
		if s == stateAbsent || s == stateDispatching {
			continue // nothing held; never outlasts dispatch
		}
		t.Run(s.String(), func(t *testing.T) {
			sc := newTestScheduler(t)
			now := sc.store.Now()
			v2, v1 := stDoc(stKey, 2), stDoc(stKey, 1)
			putIn(t, sc.tab, s, v2, now)
			sc.offer(v1, now)
			sc.onEvent(task.Event{Key: stKey, Task: v1})
			if got := sc.tab.doc(stKey); got != v2 {
				t.Fatalf("the table holds version %d; want 2", got.Version)
			}
			if got := sc.tab.state(stKey); got != s {
				t.Fatalf("an older document moved the key to %s", got)
			}
			if e, ok := sc.heap.Entry(stKey); ok && e.Task != v2 {
				t.Fatalf("the heap's entry holds version %d", e.Task.Version)
			}
			if k := sc.tab.keys[stKey]; s.aside() && k.entry.Task != v2 {
				t.Fatalf("the %s entry holds version %d", s, k.entry.Task.Version)
			}
			for _, e := range sc.locks.parkedOn(stLock) {
				if e.Task != v2 {
					t.Fatalf("the parked entry holds version %d", e.Task.Version)
				}
			}
			if s == stateClaiming {
				// The attempt, dispatched on v2, decided a retry on v2;
				// v3 was heard meanwhile: v3 goes back, not the retry.
				v3 := stDoc(stKey, 3)
				sc.onEvent(task.Event{Key: stKey, Task: v3})
				sc.onResult(attemptResult{key: stKey, doc: v2, retry: retryEntry(stEntry(v2, now), v2, now.Add(time.Hour)), slotFreed: true})
				if e, ok := sc.heap.Entry(stKey); !ok || e.Task != v3 || sc.tab.doc(stKey) != v3 {
					t.Fatalf("after the result the heap holds %+v (in: %v); want version 3", e.Task, ok)
				}
			}
			if err := sc.tab.check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPageRowOlderThanFinishIsRefused: a task that finished while a
// refill page was read is idle; the page's older pending row of it does
// not bring it back to the heap, and once the page is taken nothing of
// it is kept.
func TestPageRowOlderThanFinishIsRefused(t *testing.T) {
	sc := newTestScheduler(t)
	now := sc.store.Now()
	pending := stDoc(stKey, 1)
	sc.offer(pending, now)
	sc.tab.beginPage()
	sc.resume = pending // as fetch leaves it
	done := stDoc(stKey, 2)
	done.State = task.StateSucceeded
	sc.onEvent(task.Event{Key: stKey, Task: done})
	if got := sc.tab.state(stKey); got != stateIdle {
		t.Fatalf("a finished task is %s while a page is read; want idle", got)
	}
	sc.onPage(fetchedPage{after: pending, tasks: []*task.Task{pending}})
	if sc.heap.Has(stKey) {
		t.Fatal("the page's older pending row put a finished task back in the heap")
	}
	if got := sc.tab.state(stKey); got != stateAbsent || len(sc.tab.keys) != 0 {
		t.Fatalf("after the page the key is %s, %d rows kept; want absent, none", got, len(sc.tab.keys))
	}
}
