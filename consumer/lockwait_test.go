package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// countingLocks counts the lock acquisitions a worker tries, and which
// tasks tried.
type countingLocks struct {
	task.Store
	tries atomic.Int64
	mu    sync.Mutex
	by    map[string]bool
}

func (c *countingLocks) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if p.Line != nil {
		c.tries.Add(1)
		c.mu.Lock()
		if c.by == nil {
			c.by = map[string]bool{}
		}
		c.by[p.Holder.TaskKey] = true
		c.mu.Unlock()
	}
	return c.Store.AcquireLocks(ctx, p)
}

// awaitTried waits until each of keys has tried its lock keys.
func (c *countingLocks) awaitTried(t *testing.T, keys ...string) {
	t.Helper()
	testutil.Eventually(t, waitLong, fmt.Sprintf("%v to try their lock keys", keys), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, k := range keys {
			if !c.by[k] {
				return false
			}
		}
		return true
	})
}

// holdElsewhere takes key for a minute as a holder that no worker here
// knows: another process's task.
func holdElsewhere(t *testing.T, e *env, key string) task.Holder {
	t.Helper()
	now := e.store.Now()
	other := task.Holder{TaskKey: "elsewhere", WorkerID: "other", Attempt: 1}
	if err := e.store.AcquireLocks(t.Context(), task.LockParams{Keys: []string{key}, Holder: other, Now: now, Until: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	return other
}

// TestLockWaitDoesNotSpin: tasks waiting for a lock key that another
// process holds try it once each, then wait for the holder's release (its
// lease end, or its finish event), without trying again and again.
func TestLockWaitDoesNotSpin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	other := holdElsewhere(t, e, "dev")
	const n = 5
	for i := range n {
		e.publish(fmt.Sprintf("t%d", i), lockKeys("dev"))
	}
	counter := &countingLocks{Store: e.store}
	ran := make(chan string, n)
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		ran <- job.Task.Key
		return nil
	}, onStore(counter))
	// Each task tries about once, then waits: the second is the window.
	testutil.Consistently(t, time.Second, fmt.Sprintf("at most %d lock tries by %d tasks waiting for a key held elsewhere", 2*n, n),
		func() bool { return counter.tries.Load() <= 2*n })
	t.Logf("%d lock tries in 1s by %d tasks waiting for a key held elsewhere", counter.tries.Load(), n)
	if err := e.store.ReleaseLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: other}); err != nil {
		t.Fatal(err)
	}
	// Released without a task event: the waiters try again at the
	// holder's lease end, a minute away. Nothing ran meanwhile.
	select {
	case k := <-ran:
		t.Fatalf("%s ran while the key was held", k)
	default:
	}
}

// slowLocks delays one task's lock tries, as a busy worker process would.
type slowLocks struct {
	task.Store
	taskKey string
	delay   time.Duration
}

func (s *slowLocks) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if p.Holder.TaskKey == s.taskKey {
		time.Sleep(s.delay) // a busy process's slow try: what this store stands for
	}
	return s.Store.AcquireLocks(ctx, p)
}

// TestParkedTaskKeepsItsRank: a task waiting for a key held in its own
// process never tried the store's line, yet it ranks ahead of a task
// waiting in line on another worker: the holder's release enters its
// place (an heir), so the other worker's claim, even if it comes first,
// is refused. Without heirs the slower worker loses the key out of order.
func TestParkedTaskKeepsItsRank(t *testing.T) {
	t.Parallel()
	e := setup(t)
	release := make(chan struct{})
	order := make(chan string, 3)
	handler := func(ctx context.Context, job *consumer.Job) error {
		order <- job.Task.Key
		if job.Task.Key == "blocker" {
			return hold(ctx, t, release)
		}
		return nil
	}
	e.publish("blocker", lockKeys("dev"), pinned("w1"))
	e.worker("w1", handler, onStore(&slowLocks{Store: e.store, taskKey: "hi", delay: 300 * time.Millisecond}))
	w2locks := &countingLocks{Store: e.store}
	e.worker("w2", handler, onStore(w2locks))
	recv(t, order, "the blocker to start")
	e.publish("hi", lockKeys("dev"), pinned("w1"), priority(5))
	e.publish("lo", lockKeys("dev"), pinned("w2"))
	w2locks.awaitTried(t, "lo") // lo tries, is stopped and waits in line
	// hi parks on w1, which neither Stats nor a store write shows: give it
	// the time it takes.
	time.Sleep(300 * time.Millisecond)
	close(release)
	if first := recv(t, order, "a waiting task to start"); first != "hi" {
		t.Fatalf("%s took the key first; want hi (priority 5, parked behind the holder) before lo", first)
	}
	if next := recv(t, order, "lo to start"); next != "lo" {
		t.Fatalf("then %s; want lo", next)
	}
}

// TestLineAheadIsWoken: a task whose place stands first in a key's line
// waits for the lease of the holder that stopped it; once the key is free
// with no event to wake it, a lower task refused for that place ahead
// makes it try at once. Without that the line stands still, the key idle,
// until the first task's wait ends (here 30 s away).
func TestLineAheadIsWoken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	other := holdElsewhere(t, e, "dev")
	ran := make(chan string, 2)
	locks := &countingLocks{Store: e.store}
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		ran <- job.Task.Key
		return nil
	}, onStore(locks))
	// first waits in line (priority 5) for the holder, at most its own
	// 30 s lease; second (priority 0) retries within its 1 s lease.
	e.publish("first", lockKeys("dev"), priority(5), lease(10*time.Second, 30*time.Second))
	e.publish("second", lockKeys("dev"), lease(250*time.Millisecond, time.Second))
	locks.awaitTried(t, "first", "second") // and wait
	// The holder goes without a task event (a process that died, say).
	if err := e.store.ReleaseLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: other}); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if k := recv(t, ran, "a task to take the freed key"); k != "first" {
		t.Fatalf("%s took the key first; want first (priority 5, ahead in line)", k)
	}
	took := time.Since(released)
	t.Logf("the task ahead in line ran %s after the key was freed", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the task ahead in line ran %s after the key was freed; want it woken by the refused claim within a second or two", took)
	}
	if k := recv(t, ran, "second to run"); k != "second" {
		t.Fatalf("then %s; want second", k)
	}
}
