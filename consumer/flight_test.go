package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// heldClaim wraps a worker's store to hold its first claim of one task
// in flight: the claim write waits until write is closed, and the re-read
// after its conflict returns what it read only once result is closed.
type heldClaim struct {
	task.Store
	key            string
	writing, read  chan struct{} // closed once the write, the re-read, is held
	write, result  chan struct{}
	writeOnce      sync.Once
	readOnce       sync.Once
	reReadExpected atomic.Bool
}

func newHeldClaim(s task.Store, key string) *heldClaim {
	return &heldClaim{Store: s, key: key,
		writing: make(chan struct{}), read: make(chan struct{}),
		write: make(chan struct{}), result: make(chan struct{})}
}

func (h *heldClaim) Update(ctx context.Context, t *task.Task) error {
	if t.Key == h.key {
		h.writeOnce.Do(func() {
			close(h.writing)
			select {
			case <-h.write:
			case <-ctx.Done():
			}
			h.reReadExpected.Store(true)
		})
	}
	return h.Store.Update(ctx, t)
}

func (h *heldClaim) Get(ctx context.Context, key string) (*task.Task, error) {
	t, err := h.Store.Get(ctx, key)
	if key == h.key && h.reReadExpected.Load() {
		h.readOnce.Do(func() {
			close(h.read)
			select {
			case <-h.result:
			case <-ctx.Done():
			}
		})
	}
	return t, err
}

// TestStaleClaimResultKeepsNewerOutcome: a claim attempt that lost its
// race to a peer decides "later, when the peer's lease ends" on what it
// read; when the peer's outcome (snooze, failure with a retry delay,
// release) reaches the worker before that result does, the task is
// claimed when the outcome allows, not at the end of the lease the stale
// read showed. (TestAttemptHistory timed out so: a second attempt
// dispatched on the publish event's document lost its race to the first,
// and its retry replaced the entry the snooze event had put in the heap.)
func TestStaleClaimResultKeepsNewerOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(doc *task.Task, h task.Holder, now time.Time) error
	}{
		{"snooze", func(doc *task.Task, h task.Holder, now time.Time) error {
			return doc.Snooze(h, now.Add(200*time.Millisecond), now)
		}},
		{"fail", func(doc *task.Task, h task.Holder, now time.Time) error {
			return doc.Fail(h, "boom", now.Add(200*time.Millisecond), now)
		}},
		{"release", func(doc *task.Task, h task.Holder, now time.Time) error {
			return doc.Release(h, now)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := t.Context()
			held := newHeldClaim(e.store, "T")
			started := map[string]chan struct{}{"H": make(chan struct{}, 1), "T": make(chan struct{}, 1)}
			done := make(chan struct{})
			defer close(done)
			a := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
				send(started[job.Task.Key], struct{}{})
				if job.Task.Key == "H" {
					return hold(ctx, t, done)
				}
				return nil
			}, concurrency(2), onStore(held))
			// H takes one slot; A's claim of T, held, takes the other.
			e.publish("H", lease(100*time.Millisecond, 20*time.Second))
			recv(t, started["H"], "H's start")
			e.publish("T", lease(100*time.Millisecond, 20*time.Second))
			recv(t, held.writing, "A's claim of T")

			// Worker B claims T first; A's claim conflicts, and A reads
			// B's claim (a 20 s lease) back: its attempt will decide to
			// try again at that lease's end.
			b := task.Holder{WorkerID: "B", Instance: "b-1"}
			claimed, hb, err := preempt.ClaimTask(e.get("T"), b, e.store.Now())
			if err != nil {
				t.Fatal(err)
			}
			if err := e.store.Update(ctx, claimed); err != nil {
				t.Fatal(err)
			}
			close(held.write)
			recv(t, held.read, "A's re-read of T")

			// B's attempt ends while A's is still in flight.
			doc := e.get("T")
			if err := tc.end(doc, hb, e.store.Now()); err != nil {
				t.Fatal(err)
			}
			if err := e.store.Update(ctx, doc); err != nil {
				t.Fatal(err)
			}
			// Events come in order: once A holds the two tasks published
			// after B's outcome, its scheduler has handled that outcome.
			far := e.store.Now().Add(time.Hour)
			e.publish("M1", runAt(far))
			e.publish("M2", runAt(far))
			testutil.Eventually(t, waitLong, "A to queue M1 and M2", func() bool { return a.Stats().Queued >= 2 })

			close(held.result) // A's attempt decides on B's claim, now stale
			recv(t, started["T"], "A's claim of T after B's "+tc.name+" (not at B's lease end, 20 s)")
		})
	}
}

// heldPage wraps a worker's store to hold its first refill page (a ready
// query continuing after a resume point) after reading it: the page is
// returned once release is closed.
type heldPage struct {
	task.Store
	key           string
	read, release chan struct{}
	once          sync.Once
	updates       atomic.Int64 // writes of key through this store
}

func (h *heldPage) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	page, err := h.Store.Candidates(ctx, q)
	if q.Ready && q.After != nil {
		h.once.Do(func() {
			close(h.read)
			select {
			case <-h.release:
			case <-ctx.Done():
			}
		})
	}
	return page, err
}

func (h *heldPage) Update(ctx context.Context, t *task.Task) error {
	if t.Key == h.key {
		h.updates.Add(1)
	}
	return h.Store.Update(ctx, t)
}

// TestRefillPageKeepsNewerEvents: a backlog's next page is read aside
// while the worker goes on; a task in it that a peer claimed before the
// page came back is not put back as the page read it (pending, due now),
// which would cost a claim attempt bound to conflict.
func TestRefillPageKeepsNewerEvents(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	for i := range 10 { // B's lease on t-04 outlasts the test
		e.publish(fmt.Sprintf("t-%02d", i), lease(100*time.Millisecond, time.Minute))
	}
	held := &heldPage{Store: e.store, key: "t-04", read: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	ran := map[string]bool{}
	a := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		ran[job.Task.Key] = true
		mu.Unlock()
		return nil
	}, concurrency(1), onStore(held), func(c *consumer.Config) { c.HeapSize, c.PageSize = 4, 4 })
	recv(t, held.read, "A's refill page (t-04 to t-07)")

	// B claims t-04 while A's page, which shows it pending, is held.
	b := task.Holder{WorkerID: "B", Instance: "b-1"}
	claimed, _, err := preempt.ClaimTask(e.get("t-04"), b, e.store.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Update(ctx, claimed); err != nil {
		t.Fatal(err)
	}
	// Events come in order: once A queues the marker, it has B's claim.
	e.publish("marker", runAt(e.store.Now().Add(time.Hour)))
	testutil.Eventually(t, waitLong, "A to queue t-04 (B's lease) and the marker", func() bool { return a.Stats().Queued >= 2 })

	close(held.release)
	for _, k := range []string{"t-05", "t-06", "t-07", "t-08", "t-09"} {
		e.waitState(k, task.StateSucceeded)
	}
	if n := held.updates.Load(); n != 0 {
		t.Fatalf("A wrote t-04 %d times after B claimed it; the page's stale document was offered", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran["t-04"] {
		t.Fatal("A ran t-04, which B holds")
	}
}

// failedPage wraps a worker's store to fail its first refill page (a
// ready query continuing after a resume point) at once; failed is closed
// as it returns.
type failedPage struct {
	task.Store
	failed chan struct{}
	once   sync.Once
}

var errPageFailed = errors.New("refill page failed")

func (f *failedPage) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	fail := false
	if q.Ready && q.After != nil {
		f.once.Do(func() { fail = true })
	}
	if fail {
		defer close(f.failed)
		return nil, errPageFailed
	}
	return f.Store.Candidates(ctx, q)
}

// TestRefillPutOffWakes: a refill the rate limit puts off (a query ran
// or failed moments ago) is run when due, though the heap holds only later entries
// and nothing else comes to wake the worker; else a backlog left in the
// store waits for the safety net.
func TestRefillPutOffWakes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 4 {
		e.publish(fmt.Sprintf("t-%02d", i))
	}
	failing := &failedPage{Store: e.store, failed: make(chan struct{})}
	started := make(chan struct{})
	release := make(chan struct{})
	a := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		switch job.Task.Key {
		case "t-00":
			close(started)
			<-release
		case "t-01":
			<-failing.failed // ends moments after the refill page failed
		}
		return nil
	}, concurrency(1), onStore(failing), func(c *consumer.Config) {
		c.HeapSize, c.PageSize = 2, 2
		c.SafetyNetInterval, c.PollInterval = time.Hour, time.Hour
	})
	recv(t, started, "A's run of t-00")
	// The heap holds t-01 and, once this event is in, a task due in an hour.
	e.publish("marker", runAt(e.store.Now().Add(time.Hour)))
	testutil.Eventually(t, waitLong, "A to queue t-01 and the marker", func() bool { return a.Stats().Queued >= 2 })

	// A dispatches t-01 and reads the next page aside, which fails: the
	// query from the top is put off (a second after a failure), and only
	// the marker, an hour off, is left in the heap.
	close(release)
	for _, k := range []string{"t-01", "t-02", "t-03"} {
		e.waitState(k, task.StateSucceeded)
	}
}
