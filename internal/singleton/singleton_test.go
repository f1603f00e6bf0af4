package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// freezable passes calls to a store until frozen; then AcquireLocks hangs,
// ignoring its context, until thawed, and then goes through late, as a
// request stuck in a hung store or a paused process would.
type freezable struct {
	task.Store
	mu   sync.Mutex
	thaw chan struct{} // nil: not frozen
}

func (f *freezable) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw == nil {
		f.thaw = make(chan struct{})
	}
}

func (f *freezable) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw != nil {
		close(f.thaw)
		f.thaw = nil
	}
}

func (f *freezable) AcquireLocks(ctx context.Context, p task.LockParams) error {
	f.mu.Lock()
	thaw := f.thaw
	f.mu.Unlock()
	if thaw != nil {
		<-thaw
	}
	return f.Store.AcquireLocks(ctx, p)
}

// interval is one run of Config.Run: who ran it, from when to when.
type interval struct {
	who        string
	start, end time.Time
}

// journal records every run of the work of a group of runners and counts
// those running at once.
type journal struct {
	t       *testing.T
	mu      sync.Mutex
	runs    []interval
	active  atomic.Int32
	overlap atomic.Int32 // the most seen running at once
}

func (j *journal) work(who string) func(context.Context) error {
	return func(ctx context.Context) error {
		if n := j.active.Add(1); n > 1 {
			j.overlap.Store(n)
		}
		start := time.Now()
		<-ctx.Done()
		end := time.Now()
		j.active.Add(-1)
		j.mu.Lock()
		j.runs = append(j.runs, interval{who, start, end})
		j.mu.Unlock()
		return nil
	}
}

// check fails t if two recorded runs overlap or were ever seen at once.
func (j *journal) check() {
	j.t.Helper()
	if n := j.overlap.Load(); n > 1 {
		j.t.Errorf("%d runs at once", n)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for a := range j.runs {
		for b := range a {
			x, y := j.runs[a], j.runs[b]
			if x.start.Before(y.end) && y.start.Before(x.end) {
				j.t.Errorf("runs overlap: %s %s..%s and %s %s..%s", x.who, x.start.Format("15:04:05.000"), x.end.Format("15:04:05.000"),
					y.who, y.start.Format("15:04:05.000"), y.end.Format("15:04:05.000"))
			}
		}
	}
	for _, r := range j.runs {
		j.t.Logf("%s ran %s..%s", r.who, r.start.Format("15:04:05.000"), r.end.Format("15:04:05.000"))
	}
}

// lastEnd returns when who's latest recorded run ended.
func (j *journal) lastEnd(who string) (time.Time, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := len(j.runs) - 1; i >= 0; i-- {
		if j.runs[i].who == who {
			return j.runs[i].end, true
		}
	}
	return time.Time{}, false
}

// testTakeover runs two runners, each on its own handle of one store (as
// two processes would): the first holds while the second waits; the
// first's renewals hang (a hung store, a paused process) and its work
// stops before its lease ends, the second's starts within a lease, never
// both at once; the first's late renewal then fails and it waits; the
// second stops gracefully and the first takes over within a renewal
// period; the first is abandoned (a crash) and a third takes over within
// a lease.
func testTakeover(t *testing.T, open func() task.Store) {
	const lease, renew = 2 * time.Second, 400 * time.Millisecond
	j := &journal{t: t}
	t.Cleanup(j.check) // last: after every runner has stopped and recorded its run
	newRunner := func(id string, s task.Store) *singleton.Runner {
		r, err := singleton.New(singleton.Config{
			Store: s, Key: "test.singleton", HolderID: id, Lease: lease, Renew: renew, Run: j.work(id),
			Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, nil)).With(slog.String("runner", id)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop(context.Background()) })
		return r
	}
	sa := &freezable{Store: open()}
	a := newRunner("a", sa)
	testutil.Eventually(t, 5*time.Second, "a runs", a.Running)
	b := newRunner("b", open())
	testutil.Consistently(t, lease+renew, "a running alone while a renews", func() bool { return !b.Running() && a.Running() })

	frozen := time.Now()
	sa.freeze()
	took := testutil.EventuallyTook(t, lease+time.Second, "b runs after a's renewals hang", b.Running)
	t.Logf("takeover after renewals stopped: %s (lease %s, renewed every %s)", took.Round(time.Millisecond), lease, renew)
	if took < lease-renew-100*time.Millisecond {
		t.Errorf("b ran %s after a's renewals stopped: before a's lease can have run out", took)
	}
	aEnd, ok := j.lastEnd("a")
	if !ok || a.Running() {
		t.Fatal("a still runs after losing its lease")
	}
	if ended := aEnd.Sub(frozen); ended > lease {
		t.Errorf("a's work ended %s after its renewals stopped, later than a lease", ended)
	}

	// a's stuck renewal lands late and fails: a waits, b keeps running.
	sa.unfreeze()
	testutil.Consistently(t, lease, "b running alone after a's late renewal", func() bool { return !a.Running() && b.Running() })

	// A graceful stop releases: a takes over within a renewal period.
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = testutil.EventuallyTook(t, lease, "a runs after b stopped", a.Running)
	t.Logf("takeover after a graceful stop: %s", took.Round(time.Millisecond))
	if took > renew+300*time.Millisecond {
		t.Errorf("takeover after a release took %s, want within %s", took, renew)
	}

	// A crash leaves the lease to run out: c takes over within a lease.
	c := newRunner("c", open())
	if err := a.Abandon(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = testutil.EventuallyTook(t, lease+time.Second, "c runs after a crashed", c.Running)
	t.Logf("takeover after a crash: %s", took.Round(time.Millisecond))
	if took > lease+renew/2+300*time.Millisecond {
		t.Errorf("takeover after a crash took %s, want within about a lease (%s)", took, lease)
	}
}

func TestTakeoverSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "store.db")
	testTakeover(t, func() task.Store {
		s, err := sqlitestore.Open(context.Background(), path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

var dbSeq atomic.Int64

// openMongo opens database db on the wire test server at uri, with
// monitor (nil: none) watching its commands; the database is dropped when
// t ends.
func openMongo(t *testing.T, uri, db string, monitor *event.CommandMonitor) *mongostore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mongostore.Open(ctx, uri, &mongostore.Config{Database: db, Logger: slog.New(slog.DiscardHandler), Monitor: monitor})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Database().Drop(ctx)
		s.Close()
	})
	return s
}

func TestTakeoverMongo(t *testing.T) {
	t.Parallel()
	uri := testservers.MongoURI(t)
	db := fmt.Sprintf("lp_singleton_%d_%d", time.Now().UnixNano()%1e12, dbSeq.Add(1))
	testTakeover(t, func() task.Store { return openMongo(t, uri, db, nil) })
}

// TestRunReturnsReleases: work that returns while holding gives the lease
// up, so a peer runs, and this process tries again later.
func TestRunReturnsReleases(t *testing.T) {
	t.Parallel()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var calls atomic.Int32
	fail := errors.New("broken here")
	r, err := singleton.New(singleton.Config{Store: s, Key: "k", HolderID: "a", Lease: time.Second,
		Run: func(context.Context) error { calls.Add(1); return fail }})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(context.Background())
	testutil.Eventually(t, 5*time.Second, "two runs", func() bool { return calls.Load() >= 2 })
	// Between runs the lease is free: a peer can take it.
	testutil.Eventually(t, 5*time.Second, "the lease free between runs", func() bool {
		now := s.Now()
		err := s.AcquireLocks(context.Background(), task.LockParams{Namespace: task.LockSingleton, Keys: []string{"k"}, Holder: task.Holder{TaskKey: "k", WorkerID: "peer"}, Now: now, Until: now.Add(time.Hour)})
		return err == nil
	})
	n := calls.Load()
	testutil.Consistently(t, time.Second, "at most one more run while a peer holds the lease", func() bool { return calls.Load() <= n+1 })
}

func TestConfig(t *testing.T) {
	t.Parallel()
	s := &sqlitestore.Store{}
	run := func(context.Context) error { return nil }
	for _, c := range []struct {
		cfg   singleton.Config
		field string
	}{
		{singleton.Config{Key: "k", HolderID: "a", Run: run}, "store"},
		{singleton.Config{Store: s, HolderID: "a", Run: run}, "key"},
		{singleton.Config{Store: s, Key: "k", Run: run}, "holder id"},
		{singleton.Config{Store: s, Key: "k", HolderID: "a"}, "run"},
		{singleton.Config{Store: s, Key: "k", HolderID: "a", Run: run, Lease: 10 * time.Millisecond}, "lease"},
		{singleton.Config{Store: s, Key: "k", HolderID: "a", Run: run, Lease: -time.Second}, "lease"},
		{singleton.Config{Store: s, Key: "k", HolderID: "a", Run: run, Lease: time.Second, Renew: 600 * time.Millisecond}, "renew"},
	} {
		_, err := singleton.New(c.cfg)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("New(%+v) = %v, want ErrInvalid naming %s", c.cfg, err, c.field)
		}
	}
	r, err := singleton.New(singleton.Config{Store: s, Key: "k", HolderID: "a", Run: run})
	if err != nil {
		t.Fatal(err)
	}
	if r.Lease() != singleton.DefaultLease {
		t.Errorf("Lease() = %s, want the default %s", r.Lease(), singleton.DefaultLease)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); !errors.Is(err, lifecycle.ErrStopped) {
		t.Errorf("Start after Stop = %v, want ErrStopped", err)
	}
}
