package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// unreachableWrites wraps a store whose task writes to one key fail while
// that key is set, as if the store were out of this worker's reach.
type unreachableWrites struct {
	task.Store
	key atomic.Pointer[string]
}

func (u *unreachableWrites) Update(ctx context.Context, t *task.Task) error {
	if k := u.key.Load(); k != nil && *k == t.Key {
		return errStoreUnreachable
	}
	return u.Store.Update(ctx, t)
}

// TestIdleOwnLeaseLost: the only worker loses its lease on a task it ran,
// with no write that tells anyone: after a few renewals, the next fail
// until the lease ends (the handler is cancelled), or the handler returns
// and its outcome write fails until then. Once the store is back, the
// task runs again on that worker a lease later, not at the safety net.
func TestIdleOwnLeaseLost(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"renewals-fail", "outcome-not-written"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			us := &unreachableWrites{Store: e.store}
			cut := func() { key := "stranded"; us.key.Store(&key) }
			starts := &idleStarts{}
			rec := &recorder{claims: map[string][]consumer.ClaimEvent{}, finishes: map[string][]consumer.FinishEvent{}}
			ended := make(chan error, 1)
			e.worker("W", starts.handler(func(ctx context.Context, job *consumer.Job) error {
				if job.Task.Key != "stranded" || job.Attempt > 1 {
					return nil
				}
				if how == "outcome-not-written" {
					time.Sleep(450 * time.Millisecond) // renewals land: quiet writes, heard by no one
					cut()
					send(ended, nil)
					return nil
				}
				<-ctx.Done()
				send(ended, context.Cause(ctx))
				return context.Cause(ctx)
			}), onStore(us), idleCfg, func(c *consumer.Config) { c.Observer = rec })
			warm(t, e.store, starts, "W")
			e.publish("stranded", lease(100*time.Millisecond, time.Second))
			starts.await(t, "stranded", 1, time.Now().Add(idleSlack))
			if how == "renewals-fail" {
				time.Sleep(450 * time.Millisecond) // renewals land: quiet writes, heard by no one
				cut()
			}
			if cause := recv(t, ended, "the first run to end"); how == "renewals-fail" && !errors.Is(cause, task.ErrLeaseLost) {
				t.Fatalf("handler cancelled with %v, want a lost lease", cause)
			}
			want := map[string]consumer.Outcome{"renewals-fail": consumer.OutcomeLeaseLost, "outcome-not-written": consumer.OutcomeNotWritten}[how]
			testutil.Eventually(t, waitLong, "stranded's first attempt to give up", func() bool {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				return len(rec.finishes[testKind]) >= 2 // the warm task's and stranded's first
			})
			rec.mu.Lock()
			got := rec.finishes[testKind][1].Outcome
			rec.mu.Unlock()
			if got != want {
				t.Fatalf("stranded's first attempt ended %s, want %s", got, want)
			}
			time.Sleep(200 * time.Millisecond) // its result is in: W is idle
			until := e.get("stranded").Workers[0].LeaseUntil
			us.key.Store(nil)
			back := time.Now()
			doc := e.get("stranded")
			t.Logf("stranded: %s, attempt %d's lease ended %s ago", doc.State, len(doc.Workers), back.Sub(until).Round(time.Millisecond))
			r := starts.await(t, "stranded", 2, back.Add(idleSlack))
			t.Logf("stranded ran again %s after the store came back", r.at.Sub(back).Round(time.Millisecond))
		})
	}
}

// TestIdleHeapFullOfLaterTasks: a worker whose heap is full of tasks due
// in an hour still starts a task published ready now.
func TestIdleHeapFullOfLaterTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 12 {
		e.publish(fmt.Sprintf("tomorrow-%d", i), runAt(time.Now().Add(time.Hour)))
	}
	starts := &idleStarts{}
	e.worker("W", starts.handler(nil), idleCfg, func(c *consumer.Config) { c.HeapSize = 10 })
	time.Sleep(300 * time.Millisecond)
	e.publish("now")
	starts.await(t, "now", 1, time.Now().Add(idleSlack))
}
