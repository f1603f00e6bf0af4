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

// TestLockWaitDoesNotSpin: tasks waiting for a lock key that another
// process holds try it once each, then wait for the holder's release (its
// lease end, or its finish event), without trying again and again.
func TestLockWaitDoesNotSpin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	now := e.store.Now()
	other := task.Holder{TaskKey: "elsewhere", WorkerID: "other", Attempt: 1}
	if err := e.store.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: other, Now: now, Until: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
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
