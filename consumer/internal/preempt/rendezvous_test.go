package preempt_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

func workers(now time.Time, n int) []task.WorkerInfo {
	ws := make([]task.WorkerInfo, n)
	for i := range ws {
		ws[i] = task.WorkerInfo{ID: fmt.Sprintf("w%02d", i), Concurrency: 4, Until: now.Add(time.Second)}
	}
	return ws
}

var seq int64

// tk is a task as stored: every one with a seq of its own.
func tk(key string, pins ...string) *task.Task {
	seq++
	return &task.Task{Key: key, Kind: "k", Seq: seq, SpecificWorkerIDs: pins}
}

// TestRankIsAPermutation: workers sharing one view of the registry give
// every task distinct ranks, exactly one 0, so exactly one tries first.
func TestRankIsAPermutation(t *testing.T) {
	now := time.Now()
	ws := workers(now, 7)
	for k := range 500 {
		task := tk(fmt.Sprintf("task-%d", k))
		seen := map[int]string{}
		for _, w := range ws {
			r := preempt.NewPeers(ws, w, now).Rank(task, w.ID, 100)
			if other, dup := seen[r]; dup {
				t.Fatalf("%s: %s and %s both rank %d", task.Key, other, w.ID, r)
			}
			seen[r] = w.ID
		}
		for r := range len(ws) {
			if _, ok := seen[r]; !ok {
				t.Fatalf("%s: no worker ranks %d: %v", task.Key, r, seen)
			}
		}
	}
}

// TestRankSpreadsByWeight: each worker is preferred for a share of tasks
// proportional to its concurrency.
func TestRankSpreadsByWeight(t *testing.T) {
	now := time.Now()
	ws := workers(now, 5)
	ws[0].Concurrency = 8 // twice the others
	firsts := map[string]int{}
	const n = 30000
	for k := range n {
		task := tk(fmt.Sprintf("t%d", k))
		for _, w := range ws {
			if preempt.NewPeers(ws, w, now).Rank(task, w.ID, 1) == 0 {
				firsts[w.ID]++
			}
		}
	}
	// Weights 8, 4, 4, 4, 4: shares 1/3 and 1/6 each.
	for _, w := range ws {
		want := n / 6
		if w.Concurrency == 8 {
			want = n / 3
		}
		if got := firsts[w.ID]; got < want*9/10 || got > want*11/10 {
			t.Errorf("%s (concurrency %d) preferred for %d of %d tasks; want %d ± 10%%", w.ID, w.Concurrency, got, n, want)
		}
	}
}

// TestRankHonoursPinsKindsAndLiveness: only workers that may run the task
// and are live rank ahead; the worker itself counts before its own
// registration is read back.
func TestRankHonoursPinsKindsAndLiveness(t *testing.T) {
	now := time.Now()
	ws := workers(now, 6)
	ws[1].Kinds = []string{"other"}
	ws[2].Until = now // lapsed
	self := task.WorkerInfo{ID: "w99", Concurrency: 4}
	// w99 has not read its own registration back; w00 has.
	withSelf := append(workers(now, 0), ws...)
	withSelf = append(withSelf, task.WorkerInfo{ID: "w99", Concurrency: 4, Until: now.Add(time.Second)})
	for k := range 200 {
		task := tk(fmt.Sprintf("t%d", k), "w00", "w01", "w02", "w99")
		// Of the pinned, w01 runs another kind and w02 has lapsed: only
		// w00 and w99 rank, so w99 is 0 or 1.
		r := preempt.NewPeers(ws, self, now).Rank(task, "w99", 100)
		r0 := preempt.NewPeers(withSelf, ws[0], now).Rank(task, "w00", 100)
		if r > 1 || r+r0 != 1 {
			t.Fatalf("%s: w99 ranks %d, w00 %d; want 0 and 1 in some order", task.Key, r, r0)
		}
	}
	if r := preempt.NewPeers(ws, self, now).Rank(tk("solo", "w99"), "w99", 100); r != 0 {
		t.Fatalf("task pinned to w99 alone: rank %d", r)
	}
}

// TestRankMovesOnlyTheLeaversTasks: a worker leaving changes the
// preferred worker only of the tasks it was preferred for.
func TestRankMovesOnlyTheLeaversTasks(t *testing.T) {
	now := time.Now()
	ws := workers(now, 8)
	first := func(ws []task.WorkerInfo, task *task.Task) string {
		for _, w := range ws {
			if preempt.NewPeers(ws, w, now).Rank(task, w.ID, 1) == 0 {
				return w.ID
			}
		}
		return ""
	}
	moved := 0
	for k := range 2000 {
		task := tk(fmt.Sprintf("t%d", k))
		before, after := first(ws, task), first(ws[1:], task)
		if before != ws[0].ID && before != after {
			t.Fatalf("%s: preferred %s, then %s once %s left", task.Key, before, after, ws[0].ID)
		}
		if before == ws[0].ID {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("the leaver was preferred for no task")
	}
}

// TestShareIsWhereSelfRanksFirst: a worker's share buckets are exactly
// those of the unpinned tasks it ranks first for, the workers' shares
// partition the buckets, and a worker running fewer kinds than another
// does not take buckets from it.
func TestShareIsWhereSelfRanksFirst(t *testing.T) {
	now := time.Now()
	ws := workers(now, 5)
	ws[4].Kinds = []string{"other"}
	owner := map[int]string{}
	for _, w := range ws[:4] {
		peers := preempt.NewPeers(ws, w, now)
		share := peers.Share(w.ID, []string{"k"})
		if len(share) < task.ShareBuckets/8 {
			t.Fatalf("%s: %d of %d buckets; want about a quarter", w.ID, len(share), task.ShareBuckets)
		}
		for _, b := range share {
			if o, dup := owner[b]; dup {
				t.Fatalf("bucket %d in the shares of %s and %s", b, o, w.ID)
			}
			owner[b] = w.ID
		}
	}
	if len(owner) != task.ShareBuckets {
		t.Fatalf("the shares cover %d of %d buckets", len(owner), task.ShareBuckets)
	}
	for s := range int64(3 * task.ShareBuckets) {
		x := &task.Task{Key: fmt.Sprint(s), Kind: "k", Seq: s}
		b := task.ShareBucket(s)
		for _, w := range ws[:4] {
			if first := preempt.NewPeers(ws, w, now).Rank(x, w.ID, 1) == 0; first != (owner[b] == w.ID) {
				t.Fatalf("seq %d (bucket %d, share of %s): %s ranks first: %v", s, b, owner[b], w.ID, first)
			}
		}
	}
	if share := preempt.NewPeers(ws[:1], ws[0], now).Share(ws[0].ID, nil); share != nil {
		t.Fatalf("a lone worker's share: %d buckets; want nil (everything)", len(share))
	}
}

func TestSpreadDelay(t *testing.T) {
	s := preempt.Spread{Step: 20 * time.Millisecond, MaxRank: 3}
	for r, want := range []time.Duration{0, 20, 40, 60, 60, 60} {
		if got := s.Delay(r); got != want*time.Millisecond {
			t.Errorf("Delay(%d) = %s; want %dms", r, got, want)
		}
	}
	if r := (*preempt.Peers)(nil).Rank(tk("x"), "w", 5); r != 0 {
		t.Errorf("no peers known: rank %d; want 0", r)
	}
}

// TestPeersSameMembers: lists of the same workers compare equal whatever
// their records say; one worker more, fewer or other does not.
func TestPeersSameMembers(t *testing.T) {
	now := time.Now()
	w := func(id string, conc int) task.WorkerInfo {
		return task.WorkerInfo{ID: id, Concurrency: conc, Until: now.Add(time.Minute)}
	}
	self := w("a", 1)
	ab := preempt.NewPeers([]task.WorkerInfo{w("b", 1)}, self, now)
	if !ab.SameMembers(preempt.NewPeers([]task.WorkerInfo{w("b", 8)}, self, now)) {
		t.Error("the same workers with other records compare unequal")
	}
	for _, other := range [][]task.WorkerInfo{nil, {w("b", 1), w("c", 1)}, {w("c", 1)}} {
		if ab.SameMembers(preempt.NewPeers(other, self, now)) {
			t.Errorf("a, b compares equal to a and %v", other)
		}
	}
	if ab.SameMembers(nil) || !(*preempt.Peers)(nil).SameMembers(nil) {
		t.Error("nil lists compare wrong")
	}
}

// BenchmarkShare: the cost of working out a worker's share buckets, paid
// once each time the live workers change.
func BenchmarkShare(b *testing.B) {
	now := time.Now()
	for _, n := range []int{4, 250, 1000} {
		ws := workers(now, n)
		p := preempt.NewPeers(ws, ws[0], now)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				p.Share(ws[0].ID, nil)
			}
		})
	}
}

// TestPreferredIsRankZero: the worker Preferred names is the one that
// ranks t first, and the workers it lists are all the live ones.
func TestPreferredIsRankZero(t *testing.T) {
	now := time.Now()
	ws := workers(now, 5)
	p := preempt.NewPeers(ws, ws[0], now)
	for k := range 500 {
		task := tk(fmt.Sprintf("task-%d", k))
		task.Seq = int64(k)
		id, able := p.Preferred(task)
		if len(able) != len(ws) {
			t.Fatalf("%s: %d workers able; want %d", task.Key, len(able), len(ws))
		}
		if r := p.Rank(task, id, 100); r != 0 {
			t.Fatalf("%s: Preferred names %s, which ranks %d", task.Key, id, r)
		}
	}
}
