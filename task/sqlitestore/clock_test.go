package sqlitestore_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// skewed returns a local clock off by d from time.Now.
func skewed(d time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(d) }
}

// TestSkewedWorkers runs three consumers on one file, as three processes of
// one host would, whose local clocks are right (A), 30 s ahead (B) and 30 s
// behind (C). A task A holds under a live lease must stay A's (no takeover
// by B, no retry spent), and tasks published through one store for a worker
// on another must start at once, not 30 s late.
func TestSkewedWorkers(t *testing.T) {
	t.Parallel()
	const skew = 30 * time.Second
	path := filepath.Join(t.TempDir(), "skew.db")
	storeA := open(t, path, nil)
	storeB := open(t, path, &sqlitestore.Config{Clock: skewed(skew)})
	storeC := open(t, path, &sqlitestore.Config{Clock: skewed(-skew)})
	for name, s := range map[string]*sqlitestore.Store{"B": storeB, "C": storeC} {
		if d := s.Now().Sub(storeA.Now()).Abs(); d > time.Second {
			t.Errorf("store %s's Now is %s away from A's", name, d)
		}
	}

	r := &skewRig{t: t, starts: make(chan skewStart, 64), release: make(chan struct{})}
	defer close(r.release) // before the workers stop (cleanups run later)

	r.newWorker("A", storeA)
	r.publish(storeA, "held")
	r.await("A", "held", 5*time.Second)
	r.newWorker("B", storeB)
	r.newWorker("C", storeC)

	// Tasks for one worker published through another's store.
	for _, c := range []struct {
		via    task.Store
		key    string
		worker string
	}{
		{storeB, "ahead-to-A", "A"},  // B's clock ahead of A's
		{storeA, "right-to-C", "C"},  // C's clock behind A's
		{storeB, "ahead-to-C", "C"},  // 60 s apart
		{storeC, "behind-to-B", "B"}, // prompt even today
	} {
		at := r.publish(c.via, c.key, c.worker)
		s := r.await(c.worker, c.key, 2*time.Second)
		t.Logf("%s started %s %s after publish", c.worker, c.key, s.at.Sub(at).Round(time.Millisecond))
	}

	// Keep watching over two lease lengths: B's local clock is 30 s past
	// A's lease, so without a shared store clock it takes the task at once.
	select {
	case s := <-r.starts:
		t.Fatalf("unexpected start while A holds held: %+v", s)
	case <-time.After(3 * time.Second):
	}
	doc, err := storeA.Get(context.Background(), "held")
	if err != nil {
		t.Fatal(err)
	}
	if doc.AttemptsStarted != 1 || len(doc.Attempts) != 1 || doc.Attempts[0].WorkerID != "A" || doc.Attempts[0].State != task.AttemptRunning {
		t.Errorf("held: attempts %d, workers %+v; want A's one running attempt", doc.AttemptsStarted, doc.Attempts)
	}
	if r.cancelled.Load() {
		t.Error("A's handler was cancelled")
	}
}

// skewRig runs TestSkewedWorkers' consumers and hears every handler start.
// The task keyed "held" runs until release is closed.
type skewRig struct {
	t         *testing.T
	starts    chan skewStart
	release   chan struct{}
	cancelled atomic.Bool // a handler of "held" saw its context end
}

type skewStart struct {
	worker, key string
	attempt     int64
	at          time.Time
}

// newWorker starts a consumer with worker id id on s, stopped at cleanup.
func (r *skewRig) newWorker(id string, s task.Store) {
	t := r.t
	c, err := consumer.New(consumer.Config{
		Store:    s,
		WorkerID: id,
		Logger:   testLogger(t),
		Handler: consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			r.starts <- skewStart{job.WorkerID, job.Task.Key, int64(job.Attempt), time.Now()}
			if job.Task.Key != "held" {
				return nil
			}
			select {
			case <-r.release:
				return nil
			case <-ctx.Done():
				r.cancelled.Store(true)
				return context.Cause(ctx)
			}
		}),
		ShutdownTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, c) })
}

// await waits for worker to start key, failing on a take-over of "held"
// by another worker.
func (r *skewRig) await(worker, key string, within time.Duration) skewStart {
	t := r.t
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case s := <-r.starts:
			if s.key == "held" && s.worker != "A" {
				t.Fatalf("worker %s took over held (attempt %d) while A's lease was live", s.worker, s.attempt)
			}
			if s.worker == worker && s.key == key {
				return s
			}
			t.Errorf("unexpected start: %+v", s)
		case <-deadline:
			t.Fatalf("%s did not start %s within %s", worker, key, within)
		}
	}
}

// publish publishes key through s, pinned to pin, and returns when.
func (r *skewRig) publish(s task.Store, key string, pin ...string) time.Time {
	t := r.t
	t.Helper()
	p := task.PublishParams{Key: key, Kind: "k", Options: task.Options{
		PingInterval: 100 * time.Millisecond, WorkerTimeout: 1500 * time.Millisecond, SpecificWorkerIDs: pin,
	}}
	at := time.Now()
	if _, _, err := task.Publish(context.Background(), s, p); err != nil {
		t.Fatal(err)
	}
	return at
}

// stop stops c within a bound.
func stop(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Errorf("stop %s: %v", c.WorkerID(), err)
	}
}
