package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// countingLocks counts the lock acquisitions a worker tries.
type countingLocks struct {
	task.Store
	tries atomic.Int64
}

func (c *countingLocks) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if p.Line != nil {
		c.tries.Add(1)
	}
	return c.Store.AcquireLocks(ctx, p)
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
	time.Sleep(time.Second)
	got := counter.tries.Load()
	t.Logf("%d lock tries in 1s by %d tasks waiting for a key held elsewhere", got, n)
	if got > 2*n {
		t.Fatalf("%d lock tries in 1s by %d tasks waiting for a held key; want each to try about once", got, n)
	}
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
		time.Sleep(s.delay)
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
	e.worker("w2", handler)
	recv(t, order, "the blocker to start")
	e.publish("hi", lockKeys("dev"), pinned("w1"), priority(5))
	e.publish("lo", lockKeys("dev"), pinned("w2"))
	time.Sleep(500 * time.Millisecond) // lo tries, is stopped and waits in line; hi parks on w1
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
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		ran <- job.Task.Key
		return nil
	})
	// first waits in line (priority 5) for the holder, at most its own
	// 30 s lease; second (priority 0) retries within its 1 s lease.
	e.publish("first", lockKeys("dev"), priority(5), lease(10*time.Second, 30*time.Second))
	e.publish("second", lockKeys("dev"), lease(250*time.Millisecond, time.Second))
	time.Sleep(500 * time.Millisecond) // both tried and wait
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
