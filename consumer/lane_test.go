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

// TestInstantStreamLeavesSlotToOtherKinds: a steady stream of instant
// tasks, each running beside the last, does not keep a task of another
// kind out of the worker's only slot once that slot's handler ends.
func TestInstantStreamLeavesSlotToOtherKinds(t *testing.T) {
	e := setup(t)
	const tick = "test.tick"
	release := make(chan struct{})
	var ticksNow atomic.Int32
	ticksAtQueued := make(chan int32, 1)
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		switch {
		case job.Task.Kind == tick:
			ticksNow.Add(1)
			defer ticksNow.Add(-1)
			time.Sleep(150 * time.Millisecond) // a tick's work: three overlap
			return nil
		case job.Task.Key == "queued":
			ticksAtQueued <- ticksNow.Load()
			return nil
		}
		return hold(ctx, t, release)
	}, concurrency(1), func(c *consumer.Config) { c.InstantKinds = []string{tick} })

	e.publish("long")
	e.waitState("long", task.StateRunning)
	e.publish("queued")
	// A tick falls due every 50 ms for 3 s: three run at any moment.
	start := time.Now().Add(100 * time.Millisecond)
	for i := range 60 {
		p := params(fmt.Sprintf("tick-%02d", i), runAt(start.Add(time.Duration(i)*50*time.Millisecond)))
		p.Kind = tick
		if _, _, err := task.Publish(context.Background(), e.store, p); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, waitLong, "ticks to run beside the held slot", func() bool { return ticksNow.Load() >= 2 })
	close(release)
	if n := recv(t, ticksAtQueued, "queued to start"); n == 0 {
		t.Errorf("queued started only once no tick ran: the ticks running beside the only slot kept it when it freed")
	}
	if doc := e.get("tick-59"); doc.State == task.StateSucceeded {
		t.Errorf("queued started after the last tick ran; want it to start while the ticks go on")
	}
}

// TestHungInstantHandlersKeepNoSlot: handlers of an instant kind that
// never return fill the instant lane and no more: tasks of other kinds
// still run in the worker's only slot.
func TestHungInstantHandlersKeepNoSlot(t *testing.T) {
	e := setup(t)
	const tick = "test.tick"
	release := make(chan struct{})
	defer close(release)
	var ticks atomic.Int32
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Kind == tick {
			ticks.Add(1)
			return hold(ctx, t, release)
		}
		return nil
	}, concurrency(1), func(c *consumer.Config) { c.InstantKinds = []string{tick} })
	for i := range consumer.InstantSlots {
		p := params(fmt.Sprintf("tick-%d", i))
		p.Kind = tick
		if _, _, err := task.Publish(context.Background(), e.store, p); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 5*time.Second, "the ticks to fill the lane", func() bool { return ticks.Load() == consumer.InstantSlots })
	for i := range 3 {
		e.publish(fmt.Sprintf("work-%d", i))
	}
	for i := range 3 {
		e.waitState(fmt.Sprintf("work-%d", i), task.StateSucceeded)
	}
}

// TestInstantLaneAcrossWorkersRunsEachOnce: three workers, each with its
// only slot taken for good, claim a burst of instant tasks in their lanes
// between them: each runs once, on one worker, and no worker runs more
// than InstantSlots at once.
func TestInstantLaneAcrossWorkersRunsEachOnce(t *testing.T) {
	e := setup(t)
	const tick, n = "test.tick", 30
	release := make(chan struct{})
	defer close(release)
	var mu sync.Mutex
	runs := map[string]int{}
	now, most := map[string]int{}, map[string]int{}
	for _, id := range []string{"A", "B", "C"} {
		e.worker(id, func(ctx context.Context, job *consumer.Job) error {
			if job.Task.Kind != tick {
				return hold(ctx, t, release)
			}
			mu.Lock()
			runs[job.Task.Key]++
			now[id]++
			most[id] = max(most[id], now[id])
			mu.Unlock()
			time.Sleep(20 * time.Millisecond) // a tick's work: ticks overlap
			mu.Lock()
			now[id]--
			mu.Unlock()
			return nil
		}, onStore(e.open()), concurrency(1), func(c *consumer.Config) { c.InstantKinds = []string{tick} })
		e.publish("long-"+id, pinned(id))
		e.waitState("long-"+id, task.StateRunning)
	}
	at := time.Now().Add(300 * time.Millisecond)
	for i := range n {
		p := params(fmt.Sprintf("tick-%02d", i), runAt(at))
		p.Kind = tick
		if _, _, err := task.Publish(context.Background(), e.store, p); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		e.waitState(fmt.Sprintf("tick-%02d", i), task.StateSucceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, c := range runs {
		if c != 1 {
			t.Errorf("%s ran %d times", k, c)
		}
	}
	for id, m := range most {
		if m > consumer.InstantSlots {
			t.Errorf("%s ran %d instant tasks at once; want at most %d", id, m, consumer.InstantSlots)
		}
	}
}
