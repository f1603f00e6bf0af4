package consumer_test

// An idle worker runs no query: a heap that holds everything the last query
// found is kept true by the change stream alone, with the safety-net query
// now and then. These tests turn the safety net to an hour and check that
// each way a task becomes claimable reaches an idle worker within seconds:
// one it missed would wait for the safety net.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

const (
	idleNet   = time.Hour       // SafetyNetInterval: no safety net within a test
	idleSlack = 2 * time.Second // how long after a task became claimable its start may come
)

func idleCfg(c *consumer.Config) { c.SafetyNetInterval = idleNet }

func kinds(k ...string) workerOpt { return func(c *consumer.Config) { c.Kinds = k } }

// idleBackend opens a test's store: first the handle the test publishes
// through, another for each further worker, as other processes would; spec
// tells a worker process where the store is.
type idleBackend struct {
	name string
	open func(t *testing.T, e *env) (first task.Store, another func() task.Store, spec string)
}

var idleBackends = []idleBackend{
	{"sqlite", func(t *testing.T, e *env) (task.Store, func() task.Store, string) {
		return e.store, func() task.Store { return e.open() }, "sqlite:" + e.path
	}},
	{"mongo", func(t *testing.T, e *env) (task.Store, func() task.Store, string) {
		u, err := url.Parse(testservers.MongoURI(t))
		if err != nil {
			t.Fatal(err)
		}
		u.Path = fmt.Sprintf("/lp_idle_%d_%d", time.Now().UnixNano()%1_000_000_000, idleMongoSeq.Add(1))
		uri := u.String()
		open := func() task.Store {
			s, err := mongostore.Open(t.Context(), uri, &mongostore.Config{Logger: e.log})
			if err != nil {
				t.Fatalf("open %s: %v", uri, err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return open(), open, "mongo:" + uri
	}},
}

var idleMongoSeq atomic.Int64

// eachBackend runs test in parallel on every backend.
func eachBackend(t *testing.T, test func(t *testing.T, e *env, st task.Store, another func() task.Store, spec string)) {
	for _, b := range idleBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			st, another, spec := b.open(t, e)
			test(t, e, st, another, spec)
		})
	}
}

func publishTo(t *testing.T, st task.Store, key string, opts ...publishOpt) *task.Task {
	t.Helper()
	doc, _, err := task.Publish(t.Context(), st, params(key, opts...))
	if err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
	return doc
}

func getFrom(t *testing.T, st task.Store, key string) *task.Task {
	t.Helper()
	doc, err := st.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return doc
}

// idleStart is one handler run's start.
type idleStart struct {
	key, worker string
	attempt     int
	at          time.Time
}

// idleStarts records every handler start of a test.
type idleStarts struct {
	mu   sync.Mutex
	runs []idleStart
}

// handler records each start, then runs then (nil: succeed).
func (s *idleStarts) handler(then func(ctx context.Context, job *consumer.Job) error) func(context.Context, *consumer.Job) error {
	return func(ctx context.Context, job *consumer.Job) error {
		s.mu.Lock()
		s.runs = append(s.runs, idleStart{job.Task.Key, job.WorkerID, job.Attempt, time.Now()})
		s.mu.Unlock()
		if then == nil {
			return nil
		}
		return then(ctx, job)
	}
}

func (s *idleStarts) of(key string) []idleStart {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []idleStart
	for _, r := range s.runs {
		if r.key == key {
			out = append(out, r)
		}
	}
	return out
}

// await waits for key's nth start and fails unless it came by deadline. It
// waits a few seconds past the deadline, to tell a late start from none
// (a task missed until the safety net).
func (s *idleStarts) await(t *testing.T, key string, n int, deadline time.Time) idleStart {
	t.Helper()
	var r idleStart
	testutil.Eventually(t, time.Until(deadline)+3*time.Second,
		fmt.Sprintf("%s start %d, 3s past its deadline: the idle worker missed it (safety net %s)", key, n, idleNet),
		func() bool {
			runs := s.of(key)
			if len(runs) < n {
				return false
			}
			r = runs[n-1]
			return true
		})
	if late := r.at.Sub(deadline); late > 0 {
		t.Fatalf("%s start %d came %s after its deadline", key, n, late.Round(time.Millisecond))
	}
	return r
}

// never fails if key starts within d, while why holds.
func (s *idleStarts) never(t *testing.T, key, why string, d time.Duration) {
	t.Helper()
	testutil.Consistently(t, d, fmt.Sprintf("%s not started while %s", key, why), func() bool { return len(s.of(key)) == 0 })
}

// awaitOutcome waits until key's result is stored: its worker has no
// more to do with it.
func awaitOutcome(t *testing.T, st task.Store, key string) {
	t.Helper()
	testutil.Eventually(t, waitLong, key+" to succeed", func() bool { return getFrom(t, st, key).State == task.StateSucceeded })
}

// warm runs a task pinned to worker id and waits for its start: the worker
// is up, has queried, and is idle after.
func warm(t *testing.T, st task.Store, starts *idleStarts, id string) {
	t.Helper()
	key := "warm-" + id
	publishTo(t, st, key, pinned(id))
	starts.await(t, key, 1, time.Now().Add(waitLong))
	awaitOutcome(t, st, key) // the heap is empty
}

// TestIdlePublish: tasks published while the worker is idle start at once.
func TestIdlePublish(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env, st task.Store, _ func() task.Store, _ string) {
		starts := &idleStarts{}
		e.worker("W", starts.handler(nil), onStore(st), idleCfg)
		warm(t, st, starts, "W")
		for i := range 2 {
			key := fmt.Sprintf("fresh-%d", i)
			published := time.Now()
			publishTo(t, st, key)
			r := starts.await(t, key, 1, published.Add(idleSlack))
			t.Logf("%s started %s after its publish", key, r.at.Sub(published).Round(time.Millisecond))
			awaitOutcome(t, st, key) // idle again
		}
	})
}

// TestIdleRunAt: a task published to run 2 s later, with no write after,
// starts then.
func TestIdleRunAt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env, st task.Store, _ func() task.Store, _ string) {
		starts := &idleStarts{}
		e.worker("W", starts.handler(nil), onStore(st), idleCfg)
		warm(t, st, starts, "W")
		at := time.Now().Add(2 * time.Second)
		publishTo(t, st, "later", runAt(at))
		r := starts.await(t, "later", 1, at.Add(idleSlack))
		if early := at.Sub(r.at); early > 50*time.Millisecond {
			t.Fatalf("later started %s before its run_at", early)
		}
	})
}

// TestIdlePauseResume: a kind paused while its task is published starts
// as soon as the pause lifts.
func TestIdlePauseResume(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env, st task.Store, _ func() task.Store, _ string) {
		starts := &idleStarts{}
		e.worker("W", starts.handler(nil), onStore(st), idleCfg)
		warm(t, st, starts, "W")
		if _, err := control.Pause(t.Context(), st, control.Kind(testKind)); err != nil {
			t.Fatal(err)
		}
		// The pause is heard first: on MongoDB documents come on a stream
		// beside the tasks', so a task published at once may come before.
		e.awaitControls("W", 1, 0)
		publishTo(t, st, "held")
		starts.never(t, "held", "its kind is paused", 300*time.Millisecond)
		if _, err := control.Resume(t.Context(), st, control.Kind(testKind)); err != nil {
			t.Fatal(err)
		}
		starts.await(t, "held", 1, time.Now().Add(idleSlack))
	})
}

// TestIdleRateLimit: a task a rate limit holds back starts when the slot
// frees, or at once when the limit is removed, on whichever of two idle
// workers (each its own store handle) tries it.
func TestIdleRateLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	starts := &idleStarts{}
	e.worker("A", starts.handler(nil), idleCfg)
	e.worker("B", starts.handler(nil), onStore(e.open()), idleCfg)
	warm(t, e.store, starts, "A")
	warm(t, e.store, starts, "B")

	const per = time.Second
	if err := control.SetLimit(ctx, e.store, control.Limit{Target: control.Kind("slow"), N: 1, Per: per}); err != nil {
		t.Fatal(err)
	}
	e.publish("slow-1", kind("slow"))
	e.publish("slow-2", kind("slow"))
	// Either may go first (each worker is preferred for one of them);
	// the claims, as the store timed them, are a limit's period apart.
	first := starts.await(t, "slow-1", 1, time.Now().Add(per+idleSlack))
	starts.await(t, "slow-2", 1, first.at.Add(per+idleSlack))
	a, b := e.get("slow-1").Attempts, e.get("slow-2").Attempts
	if len(a) != 1 || len(b) != 1 {
		t.Fatalf("attempts: slow-1 %d, slow-2 %d; want one each", len(a), len(b))
	}
	if gap := a[0].StartedAt.Sub(b[0].StartedAt).Abs(); gap < per {
		t.Fatalf("slow-1 and slow-2 claimed %s apart, within the limit's %s", gap, per)
	}

	if err := control.SetLimit(ctx, e.store, control.Limit{Target: control.Kind("rare"), N: 1, Per: time.Hour}); err != nil {
		t.Fatal(err)
	}
	e.publish("rare-1", kind("rare"))
	starts.await(t, "rare-1", 1, time.Now().Add(idleSlack))
	e.publish("rare-2", kind("rare"))
	starts.never(t, "rare-2", "its limit's one slot is taken for an hour", 300*time.Millisecond)
	if _, err := control.RemoveLimit(ctx, e.store, control.Kind("rare")); err != nil {
		t.Fatal(err)
	}
	starts.await(t, "rare-2", 1, time.Now().Add(idleSlack))
}

// TestIdleLockFreed: a task waiting for a lock key starts as soon as the
// task holding the key finishes, in another process or here, not when
// its own retry (a 10 s lease away) comes.
func TestIdleLockFreed(t *testing.T) {
	t.Parallel()
	for _, elsewhere := range []bool{true, false} {
		t.Run(fmt.Sprintf("elsewhere=%t", elsewhere), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			starts := &idleStarts{}
			release := make(chan struct{})
			handler := starts.handler(func(ctx context.Context, job *consumer.Job) error {
				if job.Task.Kind == "holder" {
					return hold(ctx, t, release)
				}
				return nil
			})
			if elsewhere {
				e.worker("H", handler, onStore(e.open()), kinds("holder"), idleCfg)
				e.worker("W", handler, kinds(testKind), idleCfg)
			} else {
				e.worker("W", handler, kinds("holder", testKind), idleCfg)
			}
			warm(t, e.store, starts, "W")
			long := lease(100*time.Millisecond, 10*time.Second)
			e.publish("x", kind("holder"), lockKeys("dev"), long)
			starts.await(t, "x", 1, time.Now().Add(idleSlack))
			e.publish("y", lockKeys("dev"), long)
			starts.never(t, "y", "x holds its lock key", 300*time.Millisecond)
			close(release)
			e.waitState("x", task.StateSucceeded)
			r := starts.await(t, "y", 1, time.Now().Add(idleSlack))
			if r.worker != "W" {
				t.Fatalf("y ran on %s, want W", r.worker)
			}
		})
	}
}

// TestIdleOverflowDrains: a backlog five times the heap, queried before
// the worker starts and published in a burst after, all runs: the worker
// refills while the store holds more than its heap.
func TestIdleOverflowDrains(t *testing.T) {
	t.Parallel()
	e := setup(t)
	starts := &idleStarts{}
	for i := range 25 {
		e.publish(fmt.Sprintf("before-%d", i))
	}
	e.worker("W", starts.handler(nil), idleCfg, func(c *consumer.Config) { c.HeapSize, c.PageSize = 10, 4 })
	for i := range 25 {
		starts.await(t, fmt.Sprintf("before-%d", i), 1, time.Now().Add(waitLong))
	}
	for i := range 25 {
		awaitOutcome(t, e.store, fmt.Sprintf("before-%d", i)) // the worker is idle
	}
	for i := range 50 {
		e.publish(fmt.Sprintf("burst-%d", i))
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := range 50 {
		starts.await(t, fmt.Sprintf("burst-%d", i), 1, deadline)
	}
}

// cuttableStore wraps a store whose change streams the test cuts: cut
// closes the open streams and refuses new ones until heal, after which
// the first resume finds the history lost if asked.
type cuttableStore struct {
	task.Store
	mu       sync.Mutex
	down     bool
	lose     bool
	streams  []task.ChangeStream
	reopened int
	refused  int // opens refused while cut
}

var errStoreUnreachable = errors.New("store unreachable")

func (c *cuttableStore) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		c.refused++
		return nil, errStoreUnreachable
	}
	if p.ResumeAfter != nil {
		c.reopened++
		if c.lose {
			c.lose = false
			return nil, fmt.Errorf("resume: %w", task.ErrHistoryLost)
		}
	}
	s, err := c.Store.Watch(ctx, p)
	if err == nil {
		c.streams = append(c.streams, s)
	}
	return s, err
}

func (c *cuttableStore) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down, c.refused = true, 0
	for _, s := range c.streams {
		s.Close()
	}
	c.streams = nil
}

func (c *cuttableStore) heal(lose bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down, c.lose = false, lose
}

// TestIdleStreamCut: the worker's change stream fails and cannot reopen
// for a while; a task published meanwhile starts once it resumes, from
// its token or, when the history is lost, by a query.
func TestIdleStreamCut(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env, st task.Store, another func() task.Store, _ string) {
		cs := &cuttableStore{Store: another()}
		starts := &idleStarts{}
		e.worker("W", starts.handler(nil), onStore(cs), idleCfg)
		warm(t, st, starts, "W")
		// A doorbell write gives the MongoDB stream of documents a position:
		// until then its resume token is none, and a reopen queries. A
		// pause of a kind no task has rings it, and W says when it heard.
		if _, err := control.Pause(t.Context(), st, control.Kind("unused")); err != nil {
			t.Fatal(err)
		}
		e.awaitControls("W", 1, 0)
		for _, lose := range []bool{false, true} {
			key := fmt.Sprintf("meanwhile-lost=%t", lose)
			cs.cut()
			publishTo(t, st, key)
			testutil.Eventually(t, waitLong, "W to try to reopen its stream, refused twice", func() bool {
				cs.mu.Lock()
				defer cs.mu.Unlock()
				return cs.refused >= 2
			})
			cs.heal(lose)
			healed := time.Now()
			// The reopen backs off at most 320 ms after a few failures.
			r := starts.await(t, key, 1, healed.Add(400*time.Millisecond+idleSlack))
			t.Logf("%s started %s after the stream could reopen", key, r.at.Sub(healed).Round(time.Millisecond))
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.reopened < 2 {
			t.Fatalf("stream resumed %d times, want 2", cs.reopened)
		}
	})
}

// TestIdleSnoozeAndRetry: a task its handler snoozes for 1 s, or fails
// with a retry in 1 s, after renewing its lease a few times, runs again
// 1 s later on the same, otherwise idle, worker.
func TestIdleSnoozeAndRetry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env, st task.Store, _ func() task.Store, _ string) {
		starts := &idleStarts{}
		var mu sync.Mutex
		ended := map[string]time.Time{}
		e.worker("W", starts.handler(func(ctx context.Context, job *consumer.Job) error {
			if job.Attempt > 1 || strings.HasPrefix(job.Task.Key, "warm") {
				return nil
			}
			// Renewals, quiet writes: two, as the store shows them.
			seen := map[time.Time]bool{}
			if !testutil.Within(waitLong, func() bool {
				if tk, err := st.Get(ctx, job.Task.Key); err == nil && len(tk.Attempts) > 0 {
					seen[tk.Attempts[len(tk.Attempts)-1].LeaseUntil] = true
				}
				return len(seen) > 2
			}) {
				return errors.New("the lease was not renewed twice")
			}
			mu.Lock()
			ended[job.Task.Key] = time.Now()
			mu.Unlock()
			if job.Task.Key == "snoozed" {
				return consumer.Snooze(time.Second)
			}
			return errors.New("boom")
		}), onStore(st), idleCfg, func(c *consumer.Config) {
			c.RetryPolicy = func(int, error) time.Duration { return time.Second }
		})
		warm(t, st, starts, "W")
		for _, key := range []string{"snoozed", "retried"} {
			publishTo(t, st, key, lease(100*time.Millisecond, time.Second))
			starts.await(t, key, 1, time.Now().Add(idleSlack))
			testutil.Eventually(t, waitLong, key+" to be pending again", func() bool { return len(starts.of(key)) > 1 || getFrom(t, st, key).State == task.StatePending })
			mu.Lock()
			end := ended[key]
			mu.Unlock()
			r := starts.await(t, key, 2, end.Add(time.Second+idleSlack))
			if gap := r.at.Sub(end); gap < time.Second-50*time.Millisecond {
				t.Fatalf("%s ran again %s after its first run ended, want 1 s", key, gap)
			}
		}
	})
}

// failingQueries wraps a store whose first few candidate queries fail.
type failingQueries struct {
	task.Store
	left atomic.Int32
}

func (f *failingQueries) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	if f.left.Add(-1) >= 0 {
		return nil, errStoreUnreachable
	}
	return f.Store.Candidates(ctx, q)
}

// TestIdleQueryFails: the worker's first queries fail; the tasks published
// before it started, which no event will bring, run once a query succeeds
// (each failed one is tried again a second later).
func TestIdleQueryFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 3 {
		e.publish(fmt.Sprintf("waiting-%d", i))
	}
	fq := &failingQueries{Store: e.store}
	fq.left.Store(2)
	starts := &idleStarts{}
	began := time.Now()
	e.worker("W", starts.handler(nil), onStore(fq), idleCfg)
	for i := range 3 {
		r := starts.await(t, fmt.Sprintf("waiting-%d", i), 1, began.Add(2*time.Second+idleSlack))
		if i == 0 {
			t.Logf("first task found %s after two failed queries", r.at.Sub(began).Round(time.Millisecond))
		}
	}
	if fq.left.Load() >= 0 {
		t.Fatal("no candidate query succeeded: the tasks came some other way")
	}
}
