package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// TestLineHeldElsewhereLeavesRoomForOtherTasks: a line of tasks on a lock
// key another process holds, three times the heap bound and ahead of
// other tasks in the queue, keeps no task without that key waiting on a
// worker that starts with the backlog in the store; its store reads stop
// while the line waits (its refused claims do not read it again); and
// the line runs whole once the holder ends.
func TestLineHeldElsewhereLeavesRoomForOtherTasks(t *testing.T) {
	e := setup(t)
	const n = 20
	release := make(chan struct{})
	e.worker("B", func(ctx context.Context, job *consumer.Job) error {
		return hold(ctx, t, release)
	}, concurrency(1))
	e.publish("hog", pinned("B"), lockKeys("device:1"))
	e.waitState("hog", task.StateRunning)
	for i := range 3 * n {
		e.publish(fmt.Sprintf("line-%03d", i), pinned("A"), lockKeys("device:1"))
	}
	for i := range n {
		e.publish(fmt.Sprintf("free-%02d", i), pinned("A"))
	}
	var free, line atomic.Int32
	a := &countedCandidates{Store: e.open()}
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		if len(job.Task.LockKeys) > 0 {
			line.Add(1)
		} else {
			free.Add(1)
		}
		return nil
	}, onStore(a), func(c *consumer.Config) { c.HeapSize, c.PageSize = n, 10 })
	testutil.Eventually(t, waitLong, "the tasks without a lock key to run", func() bool { return free.Load() == n })
	testutil.Settles(t, waitLong, time.Second, "A's candidate reads to stop while the line waits", a.rows.Load)
	close(release) // hog's finish frees the key
	testutil.Eventually(t, waitLong, "the line to run once the key is free", func() bool { return line.Load() == 3*n })
}

// TestLineHeldElsewhereCostsNoReads: a worker among several that starts
// with a line of tasks on a lock key another process holds, more than a
// page of them, reads the store no more once they wait: a refill's row of
// a waiting task no newer than the one it waits on leaves its wait alone,
// so it is never found due and read again, round and round.
func TestLineHeldElsewhereCostsNoReads(t *testing.T) {
	e := setup(t)
	release := make(chan struct{})
	defer close(release)
	e.worker("B", func(ctx context.Context, job *consumer.Job) error {
		return hold(ctx, t, release)
	}, concurrency(1))
	e.publish("hog", pinned("B"), lockKeys("device:1"))
	e.waitState("hog", task.StateRunning)
	for i := range 15 {
		e.publish(fmt.Sprintf("line-%02d", i), pinned("A"), lockKeys("device:1"))
	}
	a := &countedCandidates{Store: e.open()}
	e.worker("A", func(context.Context, *consumer.Job) error { return nil }, onStore(a),
		func(c *consumer.Config) { c.HeapSize, c.PageSize = 20, 10 })
	testutil.Settles(t, waitLong, 500*time.Millisecond, "A to read the line and stop", a.rows.Load)
	rows := a.rows.Load()
	testutil.Consistently(t, 2*time.Second, "no more candidate rows read while the line waits for the key held elsewhere",
		func() bool { return a.rows.Load() == rows })
}
