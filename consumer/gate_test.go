package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// gateHandler is a handler whose tasks wait for an outside switch, as a
// device command waits for its device: Ready says no while closed is
// set, with wake closed when it opens.
type gateHandler struct {
	mu      sync.Mutex
	closed  bool
	wake    chan struct{}
	recheck time.Duration
	asked   int
	ran     chan string
}

func newGateHandler() *gateHandler {
	return &gateHandler{closed: true, wake: make(chan struct{}), ran: make(chan string, 16)}
}

func (g *gateHandler) Handle(_ context.Context, job *consumer.Job) error {
	g.ran <- job.Task.Key
	return nil
}

func (g *gateHandler) Ready(*task.Task) (consumer.Hold, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked++
	return consumer.Hold{Wake: g.wake, Recheck: g.recheck}, !g.closed
}

// open lets the tasks run; with signal, their holds are woken too.
func (g *gateHandler) open(signal bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = false
	if signal {
		close(g.wake)
	}
}

func startGated(t *testing.T, db *memstore.DB, g *gateHandler, ids []string, opts ...workerOpt) {
	t.Helper()
	for _, id := range ids {
		mux := consumer.NewMux()
		mux.Register("dev", g)
		cfg := consumer.Config{Store: db.Open(), WorkerID: id, Handler: mux,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		for _, o := range opts {
			o(&cfg)
		}
		c, err := consumer.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Stop(context.Background()) })
	}
}

func publishDev(t *testing.T, db *memstore.DB, key string) *task.Task {
	t.Helper()
	p := params(key)
	p.Kind = "dev"
	tk, _, err := task.Publish(t.Context(), db.Open(), p)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestGateHoldsWithoutWrites: a task its gate keeps back is held by both
// workers for 30 s with no write to its document (no claim, no attempt
// recorded), and runs once, within a second, when the gate's wake fires.
func TestGateHoldsWithoutWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{})
		g := newGateHandler()
		startGated(t, db, g, []string{"w1", "w2"})
		published := publishDev(t, db, "cmd-1")
		// 30 s of virtual time: the hold is the point, and nothing may be
		// written in it.
		testutil.Consistently(t, 30*time.Second, "cmd-1 held without a write", func() bool {
			got, err := db.Open().Get(t.Context(), "cmd-1")
			return err == nil && got.Version == published.Version && len(got.Attempts) == 0
		})
		g.mu.Lock()
		asked := g.asked
		g.mu.Unlock()
		if asked == 0 || asked > 2*(1+30/int(consumer.DefaultGateRecheck/time.Second)) {
			t.Errorf("the gate was asked %d times in 30 s by two workers; want at least once, at most once a recheck", asked)
		}
		opened := time.Now()
		g.open(true)
		if key := recv(t, g.ran, "the task to run"); key != "cmd-1" {
			t.Fatalf("%s ran", key)
		}
		if d := time.Since(opened); d > time.Second {
			t.Errorf("ran %s after the gate opened; want within 1 s", d)
		}
		synctest.Wait()
		select {
		case key := <-g.ran:
			t.Fatalf("%s ran twice", key)
		default:
		}
		done, err := db.Open().Get(t.Context(), "cmd-1")
		if err != nil {
			t.Fatal(err)
		}
		if done.State != task.StateSucceeded || len(done.Attempts) != 1 {
			t.Fatalf("state %s with %d attempts; want succeeded with one", done.State, len(done.Attempts))
		}
	})
}

// TestGateRecheckBoundsAMissedWake: a gate that opens without waking its
// holds (a wake missed) lets the task run by the next recheck.
func TestGateRecheckBoundsAMissedWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{})
		g := newGateHandler()
		g.recheck = 5 * time.Second
		startGated(t, db, g, []string{"w1"})
		publishDev(t, db, "cmd-1")
		testutil.Eventually(t, waitLong, "the gate to be asked", func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.asked > 0 })
		synctest.Wait() // and its answer heard: the task is held
		opened := time.Now()
		g.open(false)
		recv(t, g.ran, "the task to run")
		if d := time.Since(opened); d > g.recheck {
			t.Errorf("ran %s after the gate opened unsignalled; want within the %s recheck", d, g.recheck)
		}
	})
}

// TestGateLetsGoPastItsBoundAndWakes: with more gated tasks than the
// worker holds aside (half its heap), the rest are let go, and the gate's
// wake brings every one of them back: all run within a second of it,
// none written before.
func TestGateLetsGoPastItsBoundAndWakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 30
		db := memstore.New(memstore.Config{})
		g := newGateHandler()
		g.ran = make(chan string, n)
		startGated(t, db, g, []string{"w1"}, func(c *consumer.Config) { c.HeapSize, c.PageSize = 20, 10 })
		for i := range n {
			publishDev(t, db, fmt.Sprintf("cmd-%02d", i))
		}
		// 10 s of virtual time: the hold is the point.
		testutil.Consistently(t, 10*time.Second, "no task claimed while its gate is closed", func() bool {
			for _, tk := range db.Tasks() {
				if len(tk.Attempts) != 0 {
					t.Logf("%s claimed", tk.Key)
					return false
				}
			}
			return true
		})
		opened := time.Now()
		g.open(true)
		seen := map[string]bool{}
		for range n {
			seen[recv(t, g.ran, "every task to run")] = true
		}
		if d := time.Since(opened); d > time.Second {
			t.Errorf("%d tasks ran within %s of the wake; want within 1 s", len(seen), d)
		}
		if len(seen) != n {
			t.Errorf("%d distinct tasks ran; want %d", len(seen), n)
		}
	})
}

// TestGateLetGoCostsNoReads: with far more gated tasks than the worker
// holds aside, those let go stay out of the heap as the store is read
// (letAside asks the gate), so they are not read again and again: in
// 10 s of a settled worker, the store is read for at most one page.
func TestGateLetGoCostsNoReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 300
		db := memstore.New(memstore.Config{})
		g := newGateHandler()
		st := db.Open()
		mux := consumer.NewMux()
		mux.Register("dev", g)
		c, err := consumer.New(consumer.Config{Store: st, WorkerID: "w1", Handler: mux, HeapSize: 20, PageSize: 10,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer c.Stop(context.Background())
		for i := range n {
			publishDev(t, db, fmt.Sprintf("cmd-%03d", i))
		}
		testutil.Settles(t, waitLong, time.Second, "the first reads to settle", func() int64 { return st.Counts().CandidateRows })
		before := st.Counts()
		// 10 s of virtual time: what the held backlog costs is the point.
		testutil.Consistently(t, 10*time.Second, "at most a page (10) of candidate rows read: the let-go tasks are not read again and again",
			func() bool { return st.Counts().CandidateRows-before.CandidateRows <= 10 })
		t.Logf("%d candidate rows read in 10 s with %d tasks held or let go", st.Counts().CandidateRows-before.CandidateRows, n)
	})
}
