package consumer

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// TestLandedClaimIsRunning: a task whose claim landed is running in the
// claim table while its handler runs, and leaves the table once its
// success is written.
func TestLandedClaimIsRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{})
		started, release := make(chan string, 1), make(chan struct{})
		c, err := New(Config{Store: db.Open(), WorkerID: "w1", Logger: slog.New(slog.DiscardHandler),
			Handler: HandlerFunc(func(_ context.Context, job *Job) error {
				started <- job.Task.Key
				<-release
				return nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer c.Stop(context.Background())
		store := db.Open()
		if _, _, err := task.Publish(t.Context(), store, task.PublishParams{Key: stKey, Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-time.After(time.Minute):
			t.Fatal("the handler did not start")
		}
		synctest.Wait() // every goroutine of the worker blocked: its table can be read
		if st := c.sched.tab.State(stKey); st != claimtab.Running {
			t.Fatalf("the handler runs; the claim table says %s, want running", st)
		}
		if c.sched.tab.Attempt(stKey) == 0 {
			t.Fatal("running with no attempt number")
		}
		close(release)
		synctest.Wait()
		if got, err := store.Get(t.Context(), stKey); err != nil || got.State != task.StateSucceeded {
			t.Fatalf("after the handler returned the task is %+v (%v); want succeeded", got, err)
		}
		if st := c.sched.tab.State(stKey); st != claimtab.Absent {
			t.Fatalf("the task succeeded; the claim table says %s, want absent", st)
		}
	})
}

// TestResultBeforeLandedNoticeTaken: an attempt's claim landed and its
// run ended before the scheduler took the notice of its landing; the
// result, taken first, finds the key running all the same (the notices
// are drained before any result) and is applied: a success drops the
// key, a failure to retry puts it back in the heap at its retry time.
func TestResultBeforeLandedNoticeTaken(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want claimtab.State
	}{
		{"succeeded", nil, claimtab.Absent},
		{"retried", errors.New("try again"), claimtab.Queued},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memstore.New(memstore.Config{}).Open()
				c, err := New(Config{Store: store, WorkerID: "w1", Logger: slog.New(slog.DiscardHandler),
					RetryPolicy: func(int, error) time.Duration { return time.Minute },
					Handler:     HandlerFunc(func(context.Context, *Job) error { return tc.err })})
				if err != nil {
					t.Fatal(err)
				}
				c.handlerCtx, c.cancelHandlers = context.WithCancelCause(t.Context())
				// The scheduler's loop is not running: its methods are called
				// here, and nothing drains the notices between them.
				sc := c.newScheduler()
				doc, _, err := task.Publish(t.Context(), store, task.PublishParams{Key: stKey, Kind: "k"})
				if err != nil {
					t.Fatal(err)
				}
				sc.offer(doc, store.Now())
				sc.dispatch(t.Context())
				attempt := sc.tab.Attempt(stKey)
				if st := sc.tab.State(stKey); st != claimtab.Claiming || attempt == 0 {
					t.Fatalf("dispatched: %s, attempt %d; want claiming", st, attempt)
				}
				var r attemptResult
				select {
				case r = <-sc.results:
				case <-time.After(time.Minute):
					t.Fatal("no result")
				}
				if !r.landed || r.attempt != attempt {
					t.Fatalf("the result says landed %v, attempt %d; want true, %d", r.landed, r.attempt, attempt)
				}
				if st := sc.tab.State(stKey); st != claimtab.Claiming || !sc.landed.has(stKey, attempt) {
					t.Fatalf("before the result: %s, notice waiting %v; want claiming with its notice", st, sc.landed.has(stKey, attempt))
				}
				sc.onResult(r) // panics (strictStates) if the result finds the key claiming
				if st := sc.tab.State(stKey); st != tc.want {
					t.Fatalf("after the result the key is %s; want %s", st, tc.want)
				}
				if sc.landed.has(stKey, attempt) {
					t.Fatal("the notice is still waiting after the result")
				}
				if tc.want == claimtab.Queued {
					e, _ := sc.tab.Entry(stKey)
					if wantAt := r.doc.RunAt; !e.At.Equal(wantAt) || !wantAt.After(doc.CreatedAt) {
						t.Fatalf("queued at %v; want its retry time %v", e.At, wantAt)
					}
				}
				sc.drainLanded() // nothing left: a stale notice would move nothing
				if st := sc.tab.State(stKey); st != tc.want {
					t.Fatalf("a later drain moved the key to %s", st)
				}
				if err := sc.tab.Check(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
