package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// Every scheduler this package's tests run checks its claim table after
// each turn of its loop, and panics on a move not declared.
func init() { strictStates = true }

const (
	stKey  = "t1"
	stLock = "dev"
)

func stDoc(key string, version int64) *task.Task {
	return &task.Task{Key: key, Kind: "k", Seq: 7, Version: version, State: task.StatePending,
		ConcurrentWorkerCnt: 1, SuccessWorkerCnt: 1, WorkerTimeout: task.Duration(time.Second)}
}

func stEntry(t *task.Task, at time.Time) preempt.Entry {
	return preempt.Entry{Key: t.Key, At: at, Order: at, Seq: t.Seq, Task: t}
}

// putIn brings stKey (document doc) into s by the table's own moves.
func putIn(t *testing.T, tab *claimtab.Table, s claimtab.State, doc *task.Task, now time.Time) {
	t.Helper()
	e := stEntry(doc, now)
	if s == claimtab.Idle {
		tab.BeginPage()
		tab.Note(doc)
	}
	if s == claimtab.LetGo {
		tab.LetGo(stKey, doc, stLock)
	}
	if s != claimtab.Absent && s != claimtab.Idle && s != claimtab.LetGo {
		tab.Queue(e)
	}
	switch s {
	case claimtab.RateWaiting:
		tab.NoteRateWait(stKey)
	case claimtab.LockWaiting:
		tab.WaitLocks(stKey, []string{stLock})
	case claimtab.Dispatching, claimtab.Paused, claimtab.Gated, claimtab.LockParked, claimtab.RateParked, claimtab.Claiming, claimtab.Running:
		if _, ok := tab.Pop(now); !ok {
			t.Fatal("nothing due to dispatch")
		}
		switch s {
		case claimtab.Paused:
			tab.Pause(e)
		case claimtab.Gated:
			tab.Gate(e)
		case claimtab.LockParked:
			tab.Park(e, stLock)
		case claimtab.RateParked:
			tab.Park(e, claimtab.RateQueueKey("kind:k"))
		case claimtab.Claiming:
			tab.Claim(stKey)
		case claimtab.Running:
			tab.Land(stKey, tab.Claim(stKey))
		}
	}
	if got := tab.State(stKey); got != s {
		t.Fatalf("putIn %s: the key is %s", s, got)
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
	s.tab = claimtab.New(claimtab.Config{HeapSize: c.cfg.HeapSize, InstantKinds: c.cfg.InstantKinds, Locks: s.locks, Dropped: s.dropped,
		Refused: func(key string, from, to claimtab.State) { t.Errorf("refused: %s %s -> %s", key, from, to) }})
	return s
}

// TestOlderDocumentNeverReplacesNewer: in every state, a change event,
// query or page row of an older document than the one held leaves the
// table's document and the state's own entry (heap, pause, lock line) as
// they were; and an attempt's retry decided on an older document than one
// heard meanwhile does not replace it.
func TestOlderDocumentNeverReplacesNewer(t *testing.T) {
	for s := range claimtab.NumStates {
		if s == claimtab.Absent || s == claimtab.Dispatching {
			continue // nothing held; never outlasts dispatch
		}
		t.Run(s.String(), func(t *testing.T) {
			sc := newTestScheduler(t)
			now := sc.store.Now()
			v2, v1 := stDoc(stKey, 2), stDoc(stKey, 1)
			putIn(t, sc.tab, s, v2, now)
			sc.offer(v1, now)
			sc.onEvent(task.Event{Key: stKey, Task: v1})
			if got := sc.tab.Doc(stKey); got != v2 {
				t.Fatalf("the table holds version %d; want 2", got.Version)
			}
			if got := sc.tab.State(stKey); got != s {
				t.Fatalf("an older document moved the key to %s", got)
			}
			if e, ok := sc.tab.Entry(stKey); ok && e.Task != v2 {
				t.Fatalf("the heap's entry holds version %d", e.Task.Version)
			}
			aside := s.Aside() || s == claimtab.LockParked || s == claimtab.RateParked
			if e, ok := sc.tab.AsideEntry(stKey); aside && (!ok || e.Task != v2) {
				t.Fatalf("the %s entry holds %+v", s, e.Task)
			}
			if s.InFlight() {
				// The attempt, dispatched on v2, decided a retry on v2 (a
				// claim not landed), or ran and knows v2 as its newest (a
				// run asks no retry); v3 was heard meanwhile: v3 goes back,
				// not the retry nor v2.
				v3 := stDoc(stKey, 3)
				sc.onEvent(task.Event{Key: stKey, Task: v3})
				r := attemptResult{key: stKey, doc: v2, slotFreed: true, attempt: sc.tab.Attempt(stKey), landed: s == claimtab.Running}
				if !r.landed {
					r.retry = retryEntry(stEntry(v2, now), v2, now.Add(time.Hour))
				}
				sc.onResult(r)
				if e, ok := sc.tab.Entry(stKey); !ok || e.Task != v3 || sc.tab.Doc(stKey) != v3 {
					t.Fatalf("after the result the heap holds %+v (in: %v); want version 3", e.Task, ok)
				}
			}
			if err := sc.tab.Check(); err != nil {
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
	sc.tab.BeginPage()
	sc.resume = pending // as fetch leaves it
	done := stDoc(stKey, 2)
	done.State = task.StateSucceeded
	sc.onEvent(task.Event{Key: stKey, Task: done})
	if got := sc.tab.State(stKey); got != claimtab.Idle {
		t.Fatalf("a finished task is %s while a page is read; want idle", got)
	}
	sc.onPage(fetchedPage{after: pending, tasks: []*task.Task{pending}})
	if _, ok := sc.tab.Entry(stKey); ok {
		t.Fatal("the page's older pending row put a finished task back in the heap")
	}
	if got := sc.tab.State(stKey); got != claimtab.Absent || sc.tab.Len() != 0 {
		t.Fatalf("after the page the key is %s, %d rows kept; want absent, none", got, sc.tab.Len())
	}
}

// TestLetGoLineIsReadAgainWhenFreed: with the tasks held aside at their
// bound, a task offered on a lock key busy here is let go, and so is a
// later one on that key (the line keeps its order); neither is held,
// nor counts against the heap. Once the key frees with none parked on
// it, the tasks let go are dropped and the next refill reads from the
// top; the line's freeing before that, parked tasks still waiting,
// reads nothing.
func TestLetGoLineIsReadAgainWhenFreed(t *testing.T) {
	c, err := New(Config{Store: memstore.New(memstore.Config{}).Open(), WorkerID: "w1", HeapSize: 4, PageSize: 2,
		Handler: HandlerFunc(func(context.Context, *Job) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	sc := c.newScheduler()
	now := sc.store.Now()
	doc := func(key string) *task.Task {
		d := stDoc(key, 1)
		d.LockKeys = []string{stLock}
		return d
	}
	sc.locks.Hold([]string{stLock}) // an attempt here holds the key
	for _, key := range []string{"p1", "p2"} {
		sc.tab.Queue(stEntry(doc(key), now))
		e, _ := sc.tab.Pop(now)
		sc.tab.Park(e, stLock)
	}
	sc.offer(doc("g1"), now)
	sc.offer(doc("g2"), now)
	for _, key := range []string{"g1", "g2"} {
		if st := sc.tab.State(key); st != claimtab.LetGo {
			t.Fatalf("%s is %s with the aside bound reached and its key busy; want let-go", key, st)
		}
	}
	if sc.full() || sc.tab.Held() != 2 {
		t.Fatalf("%d held with two parked and two let go; want 2", sc.tab.Held())
	}
	if err := sc.tab.Check(); err != nil {
		t.Fatal(err)
	}
	sc.overflow = false
	sc.freed(stLock) // still parked here: the line is not free
	if sc.overflow || !sc.tab.LineLetGo(stLock) {
		t.Fatalf("freed with tasks parked: overflow %v, line let go %v", sc.overflow, sc.tab.LineLetGo(stLock))
	}
	sc.locks.Unhold([]string{stLock})
	sc.tab.WakeOne(stLock, now)
	sc.tab.WakeOne(stLock, now)
	sc.freed(stLock)
	if !sc.overflow || sc.resume != nil || sc.tab.LineLetGo(stLock) {
		t.Fatalf("the key freed: overflow %v, resume %v, line let go %v; want a refill from the top", sc.overflow, sc.resume, sc.tab.LineLetGo(stLock))
	}
	for _, key := range []string{"g1", "g2"} {
		if st := sc.tab.State(key); st != claimtab.Absent {
			t.Fatalf("%s is %s after its line freed; want absent, to be read again", key, st)
		}
	}
	if err := sc.tab.Check(); err != nil {
		t.Fatal(err)
	}
}
