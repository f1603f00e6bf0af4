package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// TestPauseLockKindAndAll pauses one lock key, then a kind, then
// everything: paused tasks stay pending while the others run, a running
// task finishes, and each resume starts the held tasks.
func TestPauseLockKindAndAll(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	release := make(chan struct{})
	started := make(chan string, 100)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		send(started, job.Task.Key)
		if job.Task.Key == "long" {
			return hold(ctx, t, release)
		}
		return nil
	})
	e.publish("long")
	recv(t, started, "the long task to start")
	if _, err := control.Pause(ctx, e.store, control.Lock("device:a")); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Pause(ctx, e.store, control.All()); err != nil {
		t.Fatal(err)
	}
	close(release) // a running task finishes under a pause
	e.waitState("long", task.StateSucceeded)

	e.publish("a1", lockKeys("device:a"))
	e.publish("b1", lockKeys("device:b"))
	e.pending(300*time.Millisecond, "under pause all", "a1", "b1")
	if _, err := control.Resume(ctx, e.store, control.All()); err != nil {
		t.Fatal(err)
	}
	e.waitState("b1", task.StateSucceeded)
	e.pending(200*time.Millisecond, "while its lock key is paused", "a1")
	if _, err := control.Resume(ctx, e.store, control.Lock("device:a")); err != nil {
		t.Fatal(err)
	}
	e.waitState("a1", task.StateSucceeded)

	// A kind pause holds that kind only.
	if _, err := control.Pause(ctx, e.store, control.Kind(testKind)); err != nil {
		t.Fatal(err)
	}
	e.publish("k1")
	e.pending(300*time.Millisecond, "while its kind is paused", "k1")
	if _, err := control.Resume(ctx, e.store, control.Kind(testKind)); err != nil {
		t.Fatal(err)
	}
	e.waitState("k1", task.StateSucceeded)
	for _, k := range []string{"long", "a1", "b1", "k1"} {
		if doc := e.get(k); len(doc.Attempts) != 1 || doc.Attempts[0].Attempt != 1 {
			t.Errorf("%s: a pause spent attempts: %+v", k, doc.Attempts)
		}
	}
}

// TestRateLimitAcrossWorkers runs tasks on two devices limited by the
// device:* default (3 per 300 ms each) on two workers with their own store
// handles, and checks every device's start times: no window of 300 ms
// holds more than 3, and no attempt was spent waiting.
func TestRateLimitAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n, per, perDevice = 3, 300 * time.Millisecond, 9
	if err := control.SetLimit(t.Context(), e.store, control.Limit{Target: control.Lock("device:*"), N: n, Per: per}); err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, *consumer.Job) error { return nil }
	e.worker("A", noop)
	e.worker("B", noop, onStore(e.open()))
	var keys []string
	for i := range perDevice {
		for _, dev := range []string{"x", "y"} {
			k := fmt.Sprintf("%s%d", dev, i)
			e.publish(k, lockKeys("device:"+dev), retries(task.NoRetries))
			keys = append(keys, k)
		}
	}
	starts := map[string][]time.Time{}
	for _, k := range keys {
		doc := e.waitState(k, task.StateSucceeded)
		if len(doc.Attempts) != 1 || doc.Attempts[0].Attempt != 1 {
			t.Errorf("%s: waiting for the limit spent attempts: %+v", k, doc.Attempts)
		}
		starts[doc.LockKeys[0]] = append(starts[doc.LockKeys[0]], doc.Attempts[0].StartedAt)
	}
	for dev, ts := range starts {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i := n; i < len(ts); i++ {
			if gap := ts[i].Sub(ts[i-n]); gap < per {
				t.Errorf("%s: starts %d and %d are %s apart: %d starts within %s, limit %d", dev, i-n, i, gap, n+1, per, n)
			}
		}
		// Not starved either: the limit, not a lost wake-up, paces them.
		if span := ts[len(ts)-1].Sub(ts[0]); span > time.Duration(perDevice/n)*per+2*time.Second {
			t.Errorf("%s: %d starts took %s at %d per %s", dev, len(ts), span, n, per)
		}
	}
}

// TestRateLimitedTasksStartByPriority queues tasks of a kind limited to
// one start per 150 ms: they start in priority, then publish order.
func TestRateLimitedTasksStartByPriority(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if err := control.SetLimit(t.Context(), e.store, control.Limit{Target: control.Kind(testKind), N: 1, Per: 150 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	prios := []int{0, 5, 1, 5, 9}
	for i, p := range prios {
		e.publish(fmt.Sprintf("t%d", i), priority(p))
	}
	var mu sync.Mutex
	var order []string
	e.worker("A", func(_ context.Context, job *consumer.Job) error {
		mu.Lock()
		order = append(order, job.Task.Key)
		mu.Unlock()
		return nil
	})
	for i := range prios {
		e.waitState(fmt.Sprintf("t%d", i), task.StateSucceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"t4", "t1", "t3", "t2", "t0"}; !slices.Equal(order, want) {
		t.Fatalf("start order %v, want %v", order, want)
	}
}

// TestRateLimitedHandlerSpendsNoRetry: a handler's RateLimited gives the
// task back without spending a retry, for at least the delay it asked.
func TestRateLimitedHandlerSpendsNoRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const delay = 200 * time.Millisecond
	var calls atomic.Int32
	starts := make(chan time.Time, 4)
	e.worker("A", func(context.Context, *consumer.Job) error {
		send(starts, time.Now())
		if calls.Add(1) == 1 {
			return consumer.RateLimited(delay)
		}
		return nil
	})
	e.publish("api-call", retries(task.NoRetries))
	e.waitState("api-call", task.StateSucceeded)
	first := <-starts
	if gap := (<-starts).Sub(first); gap < delay {
		t.Errorf("ran again %s after RateLimited(%s)", gap, delay)
	}
	if calls.Load() != 2 {
		t.Errorf("handler called %d times, want 2", calls.Load())
	}
}

// TestRemovedLimitFreesWaitingTasks: a task waiting for a long limit's
// slot starts as soon as the limit is removed, not when the slot frees.
func TestRemovedLimitFreesWaitingTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	limit := control.Limit{Target: control.Kind(testKind), N: 1, Per: time.Minute}
	if err := control.SetLimit(ctx, e.store, limit); err != nil {
		t.Fatal(err)
	}
	e.worker("A", func(context.Context, *consumer.Job) error { return nil })
	e.publish("first")
	e.waitState("first", task.StateSucceeded)
	e.publish("second")
	e.pending(300*time.Millisecond, "within the limit's minute", "second")
	removed := time.Now()
	if _, err := control.RemoveLimit(ctx, e.store, limit.Target); err != nil {
		t.Fatal(err)
	}
	e.waitState("second", task.StateSucceeded)
	if d := time.Since(removed); d > 5*time.Second {
		t.Errorf("second started %s after the limit went, want at once", d)
	}
}
