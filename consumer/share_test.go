package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// shareRun is a backlog drained by workers that know one another: the
// workers start on handles of their own of one in-memory store, read the
// registry, and then tasks are published faster than the workers' heaps
// (50) hold, so that most are read by refill queries. run is called with
// each job; a worker whose handler blocks stays busy.
type shareRun struct {
	ids         []string
	concurrency int
	publish     func(t *testing.T, st task.Store) int // returns the tasks to wait for
	run         func(ctx context.Context, job *consumer.Job) error
	// filled by start
	db      *memstore.DB
	handles map[string]*memstore.Store
}

func (r *shareRun) start(t *testing.T) (stop func()) {
	r.db = memstore.New(memstore.Config{Latency: func(memstore.Op, string) time.Duration { return time.Millisecond }})
	r.handles = map[string]*memstore.Store{}
	var cs []*consumer.Consumer
	for _, id := range r.ids {
		st := r.db.Open()
		r.handles[id] = st
		c, err := consumer.New(consumer.Config{Store: st, Handler: consumer.HandlerFunc(r.run), WorkerID: id,
			Concurrency: r.concurrency, HeapSize: 50, PageSize: 10, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	awaitPeersKnown(t, r.db.Open().Now(), cs...)
	synctest.Wait() // and has stored what it read
	return func() {
		for _, c := range cs {
			c.Stop(context.Background())
		}
	}
}

// waitSucceeded waits until n tasks succeeded, failing after limit.
func (r *shareRun) waitSucceeded(t *testing.T, n int, limit time.Duration) {
	t.Helper()
	start := time.Now()
	testutil.Eventually(t, limit, fmt.Sprintf("%d tasks to succeed", n), func() bool {
		done := 0
		for _, tk := range r.db.Tasks() {
			if tk.State == task.StateSucceeded {
				done++
			}
		}
		return done >= n
	})
	t.Logf("%d tasks succeeded in %s", n, time.Since(start))
}

// publishN publishes n tasks from 20 goroutines: a backlog in a few
// milliseconds.
func publishN(t *testing.T, st task.Store, prefix string, n int, opts ...publishOpt) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for i := g; i < n; i += 20 {
				if _, _, err := task.Publish(t.Context(), st, params(fmt.Sprintf("%s%04d", prefix, i), opts...)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestBacklogReadAboutOnceBetweenWorkers: three workers draining a
// backlog far longer than their heaps read each task about once between
// them (their refill queries read the head of the queue and then each its
// share), not once each.
func TestBacklogReadAboutOnceBetweenWorkers(t *testing.T) {
	const n = 1500
	synctest.Test(t, func(t *testing.T) {
		r := &shareRun{ids: []string{"A", "B", "C"}, concurrency: 4,
			run: func(ctx context.Context, job *consumer.Job) error { time.Sleep(5 * time.Millisecond); return nil }} // a task's work, in virtual time
		stop := r.start(t)
		defer stop()
		publishN(t, r.db.Open(), "b", n)
		r.waitSucceeded(t, n, 10*time.Second)
		var rows int64
		for id, st := range r.handles {
			c := st.Counts()
			t.Logf("%s: %d candidate rows in %d reads", id, c.CandidateRows, c.Reads)
			rows += c.CandidateRows
		}
		if per := float64(rows) / n; per > 1.5 {
			t.Errorf("three workers read %.2f candidate rows per task of a backlog; want at most 1.5 (each task about once between them)", per)
		}
	})
}

// TestBusyWorkersShareIsRun: a worker stuck on one task leaves its share
// of the backlog to the other, which runs it once its own share is done,
// although those tasks lie past the head of the queue.
func TestBusyWorkersShareIsRun(t *testing.T) {
	const n = 300
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		r := &shareRun{ids: []string{"A", "B"}, concurrency: 1,
			run: func(ctx context.Context, job *consumer.Job) error {
				if job.WorkerID == "B" {
					return hold(ctx, t, release)
				}
				return nil
			}}
		stop := r.start(t)
		defer stop()
		defer close(release)
		publishN(t, r.db.Open(), "b", n)
		r.waitSucceeded(t, n-1, 5*time.Second) // all but the one B holds
	})
}

// TestHeadOfQueueIsReadWhole: tasks at the head of the queue are known to
// every worker whatever their share: with B stuck on a task, A runs the
// urgent tasks of B's share before going on with its own backlog.
func TestHeadOfQueueIsReadWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		var order []string
		r := &shareRun{ids: []string{"A", "B"}, concurrency: 1,
			run: func(ctx context.Context, job *consumer.Job) error {
				if job.WorkerID == "B" {
					return hold(ctx, t, release)
				}
				mu.Lock()
				order = append(order, job.Task.Key)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // a task's work, in virtual time
				return nil
			}}
		stop := r.start(t)
		defer stop()
		defer close(release)
		st := r.db.Open()
		publishN(t, st, "low", 300)
		publishN(t, st, "urgent", 8, priority(5)) // heard when the heaps are full: read by queries
		r.waitSucceeded(t, 300+8-1, 30*time.Second)
		mu.Lock()
		defer mu.Unlock()
		first := order[:min(60, len(order))]
		urgent := 0
		for _, k := range order {
			if strings.HasPrefix(k, "urgent") {
				urgent++
			}
		}
		for i := range 8 {
			k := fmt.Sprintf("urgent%04d", i)
			if slices.Contains(order, k) && !slices.Contains(first, k) {
				t.Errorf("%s ran at place %d of A's runs; want within its first 60 (the head of the queue is read whole)", k, slices.Index(order, k))
			}
		}
		if urgent < 7 {
			t.Fatalf("A ran %d urgent tasks; want at least 7 (all but the one B may hold)", urgent)
		}
	})
}

// countedCandidates counts the candidate rows a store handle returns.
type countedCandidates struct {
	task.Store
	rows atomic.Int64
}

func (c *countedCandidates) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	page, err := c.Store.Candidates(ctx, q)
	c.rows.Add(int64(len(page)))
	return page, err
}

// TestBacklogReadAboutOnceOnSQLite is TestBacklogReadAboutOnceBetweenWorkers
// on one embedded store file, each worker on a handle of its own.
func TestBacklogReadAboutOnceOnSQLite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 600
	var stores []*countedCandidates
	var cs []*consumer.Consumer
	for _, id := range []string{"A", "B", "C"} {
		st := &countedCandidates{Store: e.open()}
		stores = append(stores, st)
		cs = append(cs, e.worker(id, func(context.Context, *consumer.Job) error { time.Sleep(2 * time.Millisecond); return nil }, onStore(st), // a task's work
			func(c *consumer.Config) { c.HeapSize, c.PageSize = 50, 10 }))
	}
	awaitPeersKnown(t, e.store.Now(), cs...)
	publishN(t, e.store, "b", n)
	// What is measured is the rows read, not the time: three store
	// handles taking turns at one file's write lock, beside the package's
	// other tests on a loaded machine, may take well past waitLong.
	testutil.Eventually(t, 3*waitLong, "the backlog drained", func() bool {
		st, err := e.store.Stats(t.Context())
		if err != nil {
			return false
		}
		return st.ByState()[task.StateSucceeded] == n
	})
	var rows int64
	for _, st := range stores {
		rows += st.rows.Load()
	}
	t.Logf("%d candidate rows for %d tasks", rows, n)
	// Each reading all of it would be over 1.1 a task here (the change
	// events bring many tasks before any query). Shared, it is 0.33 to
	// 0.58 alone and was 0.83 in a whole run on the saturated machine
	// (more turns at the write lock, more refills): under one a task.
	if per := float64(rows) / n; per > 1 {
		t.Errorf("three workers read %.2f candidate rows per task of a backlog; want at most 1 (each worker reading all of it is over 1.1)", per)
	}
}

// TestDeadWorkersShareMovesAtOnce: once the registry drops a dead worker,
// the others' refills start again from the top with its buckets in their
// shares, so its part of a long backlog runs beside theirs rather than
// after them.
func TestDeadWorkersShareMovesAtOnce(t *testing.T) {
	const n = 1500
	synctest.Test(t, func(t *testing.T) {
		r := &shareRun{ids: []string{"A", "B", "C"}, concurrency: 1,
			run: func(ctx context.Context, job *consumer.Job) error { time.Sleep(20 * time.Millisecond); return nil }} // a task's work, in virtual time
		stop := r.start(t)
		defer stop()
		ws, err := r.db.Open().Workers(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var c task.WorkerInfo
		for _, w := range ws {
			if w.ID == "C" {
				c = w
			}
		}
		share := preempt.NewPeers(ws, c, time.Now()).Share("C", nil)
		r.handles["C"].Cut()
		publishN(t, r.db.Open(), "b", n)
		// A and B each take about 10 s on their own shares; C's lapses
		// from the registry within its heartbeat timeout (4 s). What ran
		// of C's share by 8 s (virtual time) is the measure.
		time.Sleep(8 * time.Second)
		ofC := 0
		for _, tk := range r.db.Tasks() {
			if tk.State == task.StateSucceeded && slices.Contains(share, task.ShareBucket(tk.Seq)) {
				ofC++
			}
		}
		t.Logf("after 8 s, %d tasks of the dead worker's share ran", ofC)
		if ofC < 50 {
			t.Errorf("%d tasks of the dead worker's share ran in the 4 s after its registration lapsed; want at least 50 (its share moved to the others)", ofC)
		}
		r.waitSucceeded(t, n, 2*time.Minute)
	})
}
