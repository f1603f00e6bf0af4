package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// TestLockBacklogLeavesRoomForOtherTasks: a line of tasks on one lock
// key, three times the heap bound, waiting while a handler here holds
// the key, keeps no task without that key waiting and costs no store
// reads while it waits; once the key frees, the line runs whole, in
// publish order.
func TestLockBacklogLeavesRoomForOtherTasks(t *testing.T) {
	e := setup(t)
	const n = 60
	release := make(chan struct{})
	ran := make(chan string, n+2)
	st := &countedCandidates{Store: e.open()}
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Key == "blocker" {
			if err := hold(ctx, t, release); err != nil {
				return err
			}
		}
		ran <- job.Task.Key
		return nil
	}, onStore(st), func(c *consumer.Config) { c.HeapSize, c.PageSize = 20, 10 })
	e.publish("blocker", lockKeys("device:1"))
	e.waitState("blocker", task.StateRunning)
	for i := range n {
		e.publish(fmt.Sprintf("line-%02d", i), lockKeys("device:1"))
	}
	e.publish("free")
	if k := recv(t, ran, "a task to run"); k != "free" {
		t.Fatalf("%s ran while blocker holds its lock key", k)
	}
	rows := st.rows.Load()
	testutil.Consistently(t, time.Second, "no candidate rows read with only the waiting line left",
		func() bool { return st.rows.Load() == rows })
	close(release)
	if k := recv(t, ran, "blocker to end"); k != "blocker" {
		t.Fatalf("%s ran before blocker released the key", k)
	}
	for i := range n {
		if k, want := recv(t, ran, "the line to run"), fmt.Sprintf("line-%02d", i); k != want {
			t.Fatalf("%s ran at place %d of the line; want %s (publish order)", k, i, want)
		}
	}
}
