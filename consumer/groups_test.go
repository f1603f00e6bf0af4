package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

func group(g string) publishOpt { return func(pp *task.PublishParams) { pp.Group = g } }

// publishAll publishes the keys in one batch.
func (e *env) publishAll(ps []task.PublishParams) {
	e.t.Helper()
	if _, err := task.PublishMany(context.Background(), e.store, ps); err != nil {
		e.t.Fatalf("publish: %v", err)
	}
}

// TestGroupsFairOrder: a backlog of group a published before a few tasks
// of group b does not stand before them: with one slot, every b task
// starts among the first starts, not after a's backlog; weights split
// two backlogs in their ratio.
func TestGroupsFairOrder(t *testing.T) {
	e := setup(t)
	var ps []task.PublishParams
	for i := range 200 {
		ps = append(ps, params(fmt.Sprintf("a-%03d", i), group("a")))
	}
	for i := range 5 {
		ps = append(ps, params(fmt.Sprintf("b-%d", i), group("b")))
	}
	e.publishAll(ps)
	var mu sync.Mutex
	var started []string
	e.worker("w", func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		started = append(started, job.Task.Group)
		mu.Unlock()
		return nil
	}, concurrency(1))
	testutil.Eventually(t, time.Minute, "a's backlog done", func() bool { return e.get("a-199").State == task.StateSucceeded })
	mu.Lock()
	defer mu.Unlock()
	last := slices.Index(started, "b")
	for i, g := range started {
		if g == "b" {
			last = i
		}
	}
	// Interleaved one to one from the first start: the fifth b at
	// about the tenth start, not the 205th.
	if last < 0 || last > 20 {
		t.Fatalf("the last task of b started %dth of %d; want among the first 20", last+1, len(started))
	}
}

// TestGroupsWeights: two backlogs of weights 3 and 1 start 3 to 1.
func TestGroupsWeights(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if err := control.SetLimit(ctx, e.store, control.Limit{Target: control.Group("a"), Weight: 3}); err != nil {
		t.Fatal(err)
	}
	var ps []task.PublishParams
	for i := range 300 {
		ps = append(ps, params(fmt.Sprintf("b-%03d", i), group("b")))
	}
	for i := range 300 {
		ps = append(ps, params(fmt.Sprintf("a-%03d", i), group("a")))
	}
	e.publishAll(ps)
	var mu sync.Mutex
	var started []string
	e.worker("w", func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		started = append(started, job.Task.Group)
		mu.Unlock()
		return nil
	}, concurrency(1))
	testutil.Eventually(t, time.Minute, "200 starts", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(started) >= 200
	})
	mu.Lock()
	defer mu.Unlock()
	a := 0
	for _, g := range started[:200] {
		if g == "a" {
			a++
		}
	}
	// 3 to 1 is 150 of 200; the first tags of each group differ by a step.
	if a < 145 || a > 155 {
		t.Fatalf("a started %d of the first 200; want about 150 (weight 3 against 1)", a)
	}
}

// TestGroupsConcurrency: a group limited to 3 never runs more than 3 at
// once on two workers of 8 slots each, on each backend, and another
// group is not held up by it; the slots are recorded and given back.
func TestGroupsConcurrency(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env, st task.Store, another func() task.Store, _ string) {
		ctx := context.Background()
		if err := control.SetLimit(ctx, st, control.Limit{Target: control.Group("a"), Concurrency: 3}); err != nil {
			t.Fatal(err)
		}
		var running, most atomic.Int64
		h := func(ctx context.Context, job *consumer.Job) error {
			if job.Task.Group == "a" {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				defer running.Add(-1)
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
			}
			return nil
		}
		e.worker("w1", h, concurrency(8), onStore(st))
		e.worker("w2", h, concurrency(8), onStore(another()))
		e.awaitControls("w1", 0, 1)
		e.awaitControls("w2", 0, 1)
		var ps []task.PublishParams
		for i := range 60 {
			ps = append(ps, params(fmt.Sprintf("a-%02d", i), group("a")))
		}
		for i := range 20 {
			ps = append(ps, params(fmt.Sprintf("b-%02d", i), group("b")))
		}
		if _, err := task.PublishMany(ctx, st, ps); err != nil {
			t.Fatal(err)
		}
		get := func(key string) *task.Task {
			doc, err := st.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return doc
		}
		testutil.Eventually(t, time.Minute, "every task done", func() bool {
			for _, p := range ps {
				if get(p.Key).State != task.StateSucceeded {
					return false
				}
			}
			return true
		})
		if m := most.Load(); m > 3 {
			t.Fatalf("%d tasks of group a ran at once; the limit is 3", m)
		}
		if doc := get("a-00"); len(doc.Attempts) != 1 || len(doc.Attempts[0].Slots) != 1 {
			t.Fatalf("a-00 attempts %+v; want one with one slot", doc.Attempts)
		}
		// Each is freed just after its outcome's write.
		for i := range 3 {
			key := fmt.Sprintf("group:a#%d", i)
			testutil.Eventually(t, waitLong, "slot "+key+" freed", func() bool {
				now := st.Now()
				return st.AcquireLocks(ctx, task.LockParams{Namespace: task.LockConcurrency, Keys: []string{key}, Holder: task.Holder{TaskKey: "probe", WorkerID: "probe"}, Now: now, Until: now.Add(time.Second)}) == nil
			})
		}
	})
}

// stalledClaim holds one task's first claim write until the test lets it
// go, as a stalled store would: the claim lands with less of its lease
// left than a handler may start with.
type stalledClaim struct {
	task.Store
	taskKey string
	until   chan time.Time // the claim's lease end, as it is about to be written
	release chan struct{}
	once    sync.Once
}

func (s *stalledClaim) Update(ctx context.Context, t *task.Task) error {
	if t.Key == s.taskKey && len(t.Attempts) == 1 {
		s.once.Do(func() {
			s.until <- t.Attempts[0].LeaseUntil
			<-s.release
		})
	}
	return s.Store.Update(ctx, t)
}

// TestLateClaimKeepsItsSlot: a claim that lands too late to start its
// handler leaves the attempt running in the store until its lease ends,
// and so keeps its concurrency slot until then: the other task of the
// group, waiting for the slot, starts only after, and the attempt history
// never shows two of a group limited to one running at once.
func TestLateClaimKeepsItsSlot(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	if err := control.SetLimit(ctx, e.store, control.Limit{Target: control.Group("a"), Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 4)
	h := func(ctx context.Context, job *consumer.Job) error {
		started <- job.Task.Key
		return nil
	}
	stall := &stalledClaim{Store: e.store, taskKey: "late", until: make(chan time.Time, 1), release: make(chan struct{})}
	e.worker("w1", h, onStore(stall))
	e.awaitControls("w1", 0, 1)
	// A lease of 4 s; a handler starts only with more than a tenth of it
	// left. The claim holds the slot while its write stalls.
	e.publish("late", group("a"), lease(time.Second, 4*time.Second))
	until := recv(t, stall.until, "late's claim write")
	e.publish("next", group("a"))
	testutil.Eventually(t, waitLong, "late's lease to be 350 ms from its end", func() bool {
		return !e.store.Now().Before(until.Add(-350 * time.Millisecond))
	})
	close(stall.release)
	e.awaitLog("the late claim not to start", "claim landed after its lease ended; not starting", 1)
	got := recv(t, started, "a handler to start")
	doc, err := e.store.Get(ctx, got)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range slices.Concat(doc.History, doc.Attempts) {
		if got == "late" && a.Attempt == 1 {
			continue // the late claim itself
		}
		if a.StartedAt.Before(until) {
			t.Fatalf("%s attempt %d started at %s, before the late claim's lease ended at %s: its slot was freed early",
				got, a.Attempt, a.StartedAt.Format("05.000"), until.Format("05.000"))
		}
	}
}
