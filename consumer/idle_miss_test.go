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
			renewed := make(chan struct{})
			w := e.worker("W", starts.handler(func(ctx context.Context, job *consumer.Job) error {
				if job.Task.Key != "stranded" || job.Attempt > 1 {
					return nil
				}
				if how == "outcome-not-written" {
					select {
					case <-renewed:
					case <-ctx.Done(): // the test ended first
					}
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
			awaitRenewals(t, e.store, "stranded", 2) // quiet writes, heard by no one
			if how == "renewals-fail" {
				cut()
			} else {
				close(renewed)
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
			testutil.Eventually(t, waitLong, "W to be idle", func() bool { return w.Stats().Running == 0 })
			until := e.get("stranded").Attempts[0].LeaseUntil
			us.key.Store(nil)
			back := time.Now()
			doc := e.get("stranded")
			t.Logf("stranded: %s, attempt %d's lease ended %s ago", doc.State, len(doc.Attempts), back.Sub(until).Round(time.Millisecond))
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
	w := e.worker("W", starts.handler(nil), idleCfg, func(c *consumer.Config) { c.HeapSize = 10 })
	testutil.Eventually(t, waitLong, "W's heap to fill with later tasks", func() bool { return w.Stats().Queued == 10 })
	e.publish("now")
	starts.await(t, "now", 1, time.Now().Add(idleSlack))
}

// awaitRenewals waits until the lease of key's latest attempt has been
// renewed n times, as the store shows it.
func awaitRenewals(t *testing.T, st task.Store, key string, n int) {
	t.Helper()
	seen := map[time.Time]bool{}
	testutil.Eventually(t, waitLong, fmt.Sprintf("%d renewals of %s's lease", n, key), func() bool {
		if ws := getFrom(t, st, key).Attempts; len(ws) > 0 {
			seen[ws[len(ws)-1].LeaseUntil] = true
		}
		return len(seen) > n
	})
}
