package consumer

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/consumer/internal/standby"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

var fairT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func groupTask(group string, i int) *task.Task {
	return &task.Task{Key: fmt.Sprintf("%s-%04d", group, i), Group: group, Seq: int64(i), NextClaimAt: fairT0}
}

// TestFairClockPeersTasksDoNotMoveItsClock: one of four workers reads the
// head of the queue whole (200 of B, the group drained slowest, of which
// it is preferred for one in four) and past it its share alone (150 more
// of B, 450 of A). The tasks its peers run must not count against B
// here: of the first 200 it dispatches, A (weight 3) has 150, as it
// would with no peers. Charged for the peers' tasks too, B's own tasks
// stood tagged behind 200 ms of B's clock, and A had about 185.
func TestFairClockPeersTasksDoNotMoveItsClock(t *testing.T) {
	f := fairClock{bound: 4000}
	weight := map[string]int{"A": 3, "B": 1}
	type held struct {
		key string
		tag time.Time
		t   *task.Task
	}
	var own []held
	offer := func(tk *task.Task, preferred bool) {
		tag := f.order(tk, weight[tk.Group], fairT0, preferred)
		if preferred {
			own = append(own, held{tk.Key, tag, tk})
		}
	}
	for i := range 200 {
		offer(groupTask("B", i), i%4 == 0)
	}
	for i := range 150 {
		offer(groupTask("B", 200+i), true)
	}
	for i := range 450 {
		offer(groupTask("A", i), true)
	}
	// The peers claim the rest; this worker dispatches its own in order.
	slices.SortStableFunc(own, func(a, b held) int { return a.tag.Compare(b.tag) })
	a := 0
	for _, h := range own[:200] {
		f.popped(preempt.Entry{Key: h.key, Task: h.t})
		if h.t.Group == "A" {
			a++
		}
	}
	if a < 148 || a > 152 {
		t.Fatalf("A had %d of the first 200 dispatched; want 150 (weight 3 against 1)", a)
	}
}

// TestFairClockPruneKeepsHeldTags: past its bound the clock forgets the
// tags of tasks no longer held, but keeps those held and the groups'
// clocks: a group's next task is tagged after its last, not from the
// virtual time, where it would stand before the other groups' tasks
// tagged already.
func TestFairClockPruneKeepsHeldTags(t *testing.T) {
	f := fairClock{bound: 10}
	tags := map[string]time.Time{}
	for i := range 6 {
		for _, g := range []string{"A", "B"} {
			tk := groupTask(g, i)
			tags[tk.Key] = f.order(tk, 1, fairT0, true)
		}
	}
	gone := map[string]bool{}
	for _, k := range []string{"A-0000", "B-0000", "A-0001", "B-0001"} {
		f.popped(preempt.Entry{Key: k, Task: &task.Task{Key: k, Group: k[:1]}})
		gone[k] = true
	}
	lastA := f.last["A"]
	f.prune(func(key string) bool { return !gone[key] })
	if len(f.tags) != 8 {
		t.Fatalf("%d tags kept; want the 8 held", len(f.tags))
	}
	for k, tag := range f.tags {
		if !tag.Equal(tags[k]) {
			t.Fatalf("%s's tag moved from %s to %s", k, tags[k], tag)
		}
	}
	next := f.order(groupTask("A", 6), 1, fairT0, true)
	if want := lastA.Add(fairStep); !next.Equal(want) {
		t.Fatalf("A's next tag %s; want %s, after its last", next.Sub(fairT0), want.Sub(fairT0))
	}
}

// TestHeldByGroupTail: a group's tail is its ready task held last in the
// store's order (priority, then claim time, then seq); one waiting for a
// later claim time is counted but is not the tail.
func TestHeldByGroupTail(t *testing.T) {
	now := fairT0.Add(time.Minute)
	mk := func(key, group string, prio int, at time.Time, seq int64) preempt.Entry {
		return preempt.Entry{Key: key, Task: &task.Task{Key: key, Group: group, Priority: prio, NextClaimAt: at, Seq: seq}}
	}
	entries := []preempt.Entry{
		mk("a1", "A", 0, fairT0, 5),
		mk("a2", "A", 0, fairT0.Add(time.Second), 3),
		mk("a3", "A", 0, fairT0, 9),
		mk("a4", "A", 0, now.Add(time.Hour), 1), // a retry waiting
		mk("b1", "B", 5, fairT0, 20),
		mk("b2", "B", 0, fairT0, 10), // a lower priority comes after
		{Key: "x"},                   // no document
	}
	held, tail := heldByGroup(func(fn func(preempt.Entry)) {
		for _, e := range entries {
			fn(e)
		}
	}, now)
	if held["A"] != 4 || held["B"] != 2 {
		t.Fatalf("held %v; want A 4, B 2", held)
	}
	if tail["A"].Key != "a2" || tail["B"].Key != "b2" {
		t.Fatalf("tails A %s, B %s; want a2 and b2", tail["A"].Key, tail["B"].Key)
	}
}

// TestRetagOnPeersChange: a worker alone tags every task it holds as its
// own; once a peer joins, the tasks the peer is now preferred for would
// leave holes in its groups' clocks. retag gives its own tasks of each
// group consecutive tags again from the virtual time, and moves the
// peer's behind them by the stand-by, in their claim time too.
func TestRetagOnPeersChange(t *testing.T) {
	now := fairT0
	self := task.WorkerInfo{ID: "w1", Concurrency: 1, Until: now.Add(time.Hour)}
	peers := &atomic.Pointer[preempt.Peers]{}
	peers.Store(preempt.NewPeers(nil, self, now))
	s := &scheduler{
		cfg:     Config{HeapSize: 1000, WorkerID: "w1"},
		tab:     claimtab.New(claimtab.Config{HeapSize: 1000, Locks: claimtab.NewLocks()}),
		ctl:     &atomic.Pointer[control.State]{},
		peers:   peers,
		standBy: standby.New("w1", preempt.DefaultSpread, peers, 4000),
	}
	place := func(tk *task.Task) {
		delay := s.standBy.Delay(tk, now)
		s.tab.Place(preempt.Entry{Key: tk.Key, At: now.Add(delay), Order: s.fairOrder(tk, now, delay), Seq: tk.Seq, Task: tk})
	}
	for i := range 40 {
		place(groupTask("A", 2*i))
		place(groupTask("B", 2*i+1))
	}
	s.retag(now) // the first peers seen: nothing moves
	peer := task.WorkerInfo{ID: "w2", Concurrency: 1, Until: now.Add(time.Hour)}
	peers.Store(preempt.NewPeers([]task.WorkerInfo{self, peer}, self, now))
	s.retag(now)

	own := map[string][]time.Time{}
	theirs := 0
	s.tab.EachQueued(func(e preempt.Entry) {
		delay := s.standBy.Delay(e.Task, now)
		if delay == 0 {
			own[e.Task.Group] = append(own[e.Task.Group], e.Order)
			return
		}
		theirs++
		if !e.At.Equal(now.Add(delay)) {
			t.Errorf("%s, a peer's now, due at +%s; want its stand-by, +%s", e.Key, e.At.Sub(now), delay)
		}
		if e.Order.Sub(now) <= delay {
			t.Errorf("%s, a peer's now, ordered at +%s; want after its stand-by, %s", e.Key, e.Order.Sub(now), delay)
		}
	})
	if theirs == 0 || len(own["A"]) == 0 || len(own["B"]) == 0 {
		t.Fatalf("own A %d, own B %d, the peer's %d: want some of each", len(own["A"]), len(own["B"]), theirs)
	}
	for g, orders := range own {
		slices.SortFunc(orders, func(a, b time.Time) int { return a.Compare(b) })
		for i, o := range orders {
			// The virtual time is fairT0 (nothing dispatched).
			if want := now.Add(time.Duration(i+1) * fairStep); !o.Equal(want) {
				t.Fatalf("%s's %dth own task ordered at +%s; want +%s, its tags consecutive", g, i+1, o.Sub(now), want.Sub(now))
			}
		}
	}
}

// TestAdoptTailsTakesTheLongerSharesEnds: of 20 tasks left, w1's share
// has 2, w2's 10 and w3's 8; each should have 7. w1, the one taker,
// takes the ends of the longer shares beyond 7 (the tasks their owners
// reach last); w2 and w3 take nothing.
func TestAdoptTailsTakesTheLongerSharesEnds(t *testing.T) {
	owner := map[string]string{}
	var rest []*task.Task
	for i, w := range []string{"w2", "w3", "w2", "w1", "w2", "w3", "w2", "w3", "w2", "w3", "w2", "w1", "w3", "w2", "w3", "w2", "w3", "w2", "w3", "w2"} {
		tk := groupTask("A", i)
		owner[tk.Key] = w
		rest = append(rest, tk)
	}
	preferred := func(tk *task.Task) (string, []string) { return owner[tk.Key], []string{"w1", "w2", "w3"} }
	none := func(*task.Task) bool { return false }
	var want []string
	count := map[string]int{}
	for _, tk := range rest {
		if count[owner[tk.Key]]++; count[owner[tk.Key]] > 7 {
			want = append(want, tk.Key)
		}
	}
	slices.SortFunc(want, func(a, b string) int { // w2's, then w3's
		if owner[a] != owner[b] {
			return strings.Compare(owner[a], owner[b])
		}
		return strings.Compare(a, b)
	})
	var got []string
	for _, tk := range adoptTails(rest, "w1", preferred, none, 100) {
		got = append(got, tk.Key)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("w1 takes %v; want %v, the ends of w2's and w3's shares", got, want)
	}
	if n := len(adoptTails(rest, "w1", preferred, none, 2)); n != 2 {
		t.Fatalf("w1 wanting 2 takes %d", n)
	}
	for _, w := range []string{"w2", "w3"} {
		if got := adoptTails(rest, w, preferred, none, 100); len(got) != 0 {
			t.Fatalf("%s, over its part, takes %d", w, len(got))
		}
	}
	// Read again before any is run: what it took counts as its own, and
	// it takes no more.
	took := map[string]bool{}
	for _, k := range want {
		took[k] = true
	}
	if got := adoptTails(rest, "w1", preferred, func(tk *task.Task) bool { return took[tk.Key] }, 100); len(got) != 0 {
		t.Fatalf("w1 read again takes %d more", len(got))
	}
}
