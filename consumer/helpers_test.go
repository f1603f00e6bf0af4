package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Short leases keep every test fast: a dead worker's task is taken over
// after testTimeout. Not shorter: on a loaded 2-core machine a renewal can
// take a few hundred milliseconds, and a worker then rightly loses its lease.
const (
	testPing    = 100 * time.Millisecond
	testTimeout = 1500 * time.Millisecond
	testKind    = "test"
	waitLong    = 10 * time.Second
)

// errTestOver is what blocked handlers return when the test ends first.
var errTestOver = errors.New("test over")

// env is one test's store file and the workers on it.
type env struct {
	t     *testing.T
	path  string
	store *sqlitestore.Store
	log   *slog.Logger
	logs  *testutil.SyncBuffer // what log wrote, for tests that wait for a line
}

// setup opens a fresh store file in t.TempDir(); it is closed after every
// worker of the test has stopped.
func setup(t *testing.T) *env {
	t.Helper()
	e := &env{
		t:    t,
		path: filepath.Join(t.TempDir(), "tasks.db"),
		logs: &testutil.SyncBuffer{},
	}
	e.log = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), e.logs), &slog.HandlerOptions{Level: slog.LevelInfo}))
	e.store = e.open()
	return e
}

// open opens another handle on the test's store file, as another process
// would.
func (e *env) open() *sqlitestore.Store {
	e.t.Helper()
	s, err := sqlitestore.Open(context.Background(), e.path, &sqlitestore.Config{Logger: e.log})
	if err != nil {
		e.t.Fatalf("open store: %v", err)
	}
	e.t.Cleanup(func() {
		if err := s.Close(); err != nil {
			e.t.Errorf("close store: %v", err)
		}
	})
	return s
}

type workerOpt func(*consumer.Config)

func concurrency(n int) workerOpt    { return func(c *consumer.Config) { c.Concurrency = n } }
func onStore(s task.Store) workerOpt { return func(c *consumer.Config) { c.Store = s } }
func shutdownAfter(d time.Duration) workerOpt {
	return func(c *consumer.Config) { c.ShutdownTimeout = d }
}

// worker starts a consumer with id on the test's store and stops it when
// the test ends (before the store closes).
func (e *env) worker(id string, h func(ctx context.Context, job *consumer.Job) error, opts ...workerOpt) *consumer.Consumer {
	e.t.Helper()
	c, _ := e.workerCtx(context.Background(), id, h, opts...)
	return c
}

func (e *env) workerCtx(ctx context.Context, id string, h func(ctx context.Context, job *consumer.Job) error, opts ...workerOpt) (*consumer.Consumer, consumer.Config) {
	e.t.Helper()
	cfg := consumer.Config{
		Store:           e.store,
		Handler:         consumer.HandlerFunc(h),
		WorkerID:        id,
		Concurrency:     4,
		ShutdownTimeout: 2 * time.Second,
		RetryBackoff:    10 * time.Millisecond,
		Logger:          e.log,
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := consumer.New(cfg)
	if err != nil {
		e.t.Fatalf("new consumer %s: %v", id, err)
	}
	if err := c.Start(ctx); err != nil {
		e.t.Fatalf("start consumer %s: %v", id, err)
	}
	e.t.Cleanup(func() { stop(e.t, c) })
	return c, cfg
}

// awaitLog waits until line is in what the env's logger wrote n times.
func (e *env) awaitLog(what, line string, n int) {
	e.t.Helper()
	testutil.Eventually(e.t, waitLong, what, func() bool { return strings.Count(e.logs.String(), line) >= n })
}

// awaitControls waits until worker id has loaded pauses pauses and limits
// limits: a claim it tries after obeys them.
func (e *env) awaitControls(id string, pauses, limits int) {
	e.t.Helper()
	e.awaitLog(fmt.Sprintf("%s to load %d pauses and %d limits", id, pauses, limits),
		fmt.Sprintf(`msg=controls worker=%s pauses=%d limits=%d`, id, pauses, limits), 1)
}

// stop stops c, failing the test if that takes unreasonably long.
func stop(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Stop(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("stop %s: %v", c.WorkerID(), err)
		}
	case <-time.After(2 * waitLong):
		t.Fatalf("stop %s hangs", c.WorkerID())
	}
}

type publishOpt func(*task.PublishParams)

func priority(p int) publishOpt     { return func(pp *task.PublishParams) { pp.Priority = p } }
func runAt(at time.Time) publishOpt { return func(pp *task.PublishParams) { pp.RunAt = at } }
func pinned(ids ...string) publishOpt {
	return func(pp *task.PublishParams) { pp.SpecificWorkerIDs = ids }
}
func lockKeys(keys ...string) publishOpt { return func(pp *task.PublishParams) { pp.LockKeys = keys } }
func retries(n int) publishOpt           { return func(pp *task.PublishParams) { pp.MaxUnexpectedRetries = n } }
func rerun() publishOpt                  { return func(pp *task.PublishParams) { pp.Rerun = true } }
func lease(ping, timeout time.Duration) publishOpt {
	return func(pp *task.PublishParams) { pp.PingInterval, pp.WorkerTimeout = ping, timeout }
}
func workers(concurrent, success int) publishOpt {
	return func(pp *task.PublishParams) { pp.ConcurrentWorkerCnt, pp.SuccessWorkerCnt = concurrent, success }
}

func params(key string, opts ...publishOpt) task.PublishParams {
	p := task.PublishParams{Key: key, Kind: testKind}
	p.PingInterval, p.WorkerTimeout = testPing, testTimeout
	for _, o := range opts {
		o(&p)
	}
	return p
}

// publish publishes key through the test's first store handle.
func (e *env) publish(key string, opts ...publishOpt) (*task.Task, task.PublishResult) {
	e.t.Helper()
	t, res, err := task.Publish(context.Background(), e.store, params(key, opts...))
	if err != nil {
		e.t.Fatalf("publish %s: %v", key, err)
	}
	return t, res
}

func (e *env) get(key string) *task.Task {
	e.t.Helper()
	t, err := e.store.Get(context.Background(), key)
	if err != nil {
		e.t.Fatalf("get %s: %v", key, err)
	}
	return t
}

// waitState polls key until it is in state and returns that document.
func (e *env) waitState(key string, state task.State) *task.Task {
	e.t.Helper()
	var doc *task.Task
	testutil.Eventually(e.t, waitLong, fmt.Sprintf("task %s to be %s", key, state), func() bool {
		doc = e.get(key)
		return doc.State == state
	})
	return doc
}

// pending fails unless each of keys stays pending in the store for d,
// while why holds.
func (e *env) pending(d time.Duration, why string, keys ...string) {
	e.t.Helper()
	testutil.Consistently(e.t, d, fmt.Sprintf("%v pending %s", keys, why), func() bool {
		for _, k := range keys {
			if e.get(k).State != task.StatePending {
				return false
			}
		}
		return true
	})
}

// awaitPeersKnown waits until each of cs has read the registry since
// registered (store time, after every one of them started): each then
// knows the others, and takes its share of claims.
func awaitPeersKnown(t *testing.T, registered time.Time, cs ...*consumer.Consumer) {
	t.Helper()
	testutil.Eventually(t, waitLong, "each worker to read the registry with the others in it", func() bool {
		for _, c := range cs {
			if r, ok := c.Registration(); !ok || r.Err != nil || !r.At.After(registered) {
				return false
			}
		}
		return true
	})
}

// recv waits for one value from ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLong):
		t.Fatalf("timed out after %s waiting for %s", waitLong, what)
		panic("unreachable")
	}
}

// send offers v on ch without blocking: a handler that runs more often
// than the test expects must not hang the worker's Stop.
func send[T any](ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// hold blocks a handler until release is closed (nil), its context ends
// (the cause), or the test is over.
func hold(ctx context.Context, t *testing.T, release <-chan struct{}) error {
	select {
	case <-release:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.Context().Done():
		return errTestOver
	}
}

// entry returns worker id's entry in doc, failing if there is not exactly one.
func entry(t *testing.T, doc *task.Task, id string) task.Attempt {
	t.Helper()
	var found []task.Attempt
	for _, w := range doc.Attempts {
		if w.WorkerID == id {
			found = append(found, w)
		}
	}
	if len(found) != 1 {
		t.Fatalf("task %s: want one entry of %s, have workers %+v", doc.Key, id, doc.Attempts)
	}
	return found[0]
}
