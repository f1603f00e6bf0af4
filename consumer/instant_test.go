package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// TestInstantKindBesideFullSlots: with the only slot held by a handler
// that does not end, tasks of an instant kind that fall due are claimed
// and run beside it, at most InstantSlots at once, while a task of
// another kind waits for the slot.
func TestInstantKindBesideFullSlots(t *testing.T) {
	e := setup(t)
	const tick = "test.tick"
	release := make(chan struct{})
	var mu sync.Mutex
	started := map[string]bool{}
	ticksNow, ticksMost, slotNow, slotMost := 0, 0, 0, 0
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		started[job.Task.Key] = true
		if job.Task.Kind == tick {
			ticksNow++
			ticksMost = max(ticksMost, ticksNow)
		} else {
			slotNow++
			slotMost = max(slotMost, slotNow)
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			if job.Task.Kind == tick {
				ticksNow--
			} else {
				slotNow--
			}
			mu.Unlock()
		}()
		if job.Task.Kind == tick {
			time.Sleep(50 * time.Millisecond) // a tick's work: long enough for the ticks to overlap
			return nil
		}
		return hold(ctx, t, release)
	}, concurrency(1), func(c *consumer.Config) { c.InstantKinds = []string{tick} })

	e.publish("long")
	e.waitState("long", task.StateRunning)
	e.publish("queued")
	at := time.Now().Add(300 * time.Millisecond)
	var ticks []string
	for i := range 3 * consumer.InstantSlots {
		k := fmt.Sprintf("tick-%d", i)
		ticks = append(ticks, k)
		p := params(k, runAt(at))
		p.Kind = tick
		if _, _, err := task.Publish(context.Background(), e.store, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range ticks {
		if doc := e.waitState(k, task.StateSucceeded); doc.Attempts[0].StartedAt.Before(at) {
			t.Errorf("%s started at %s, before its time %s", k, doc.Attempts[0].StartedAt, at)
		}
	}
	mu.Lock()
	queuedRan := started["queued"]
	mostTicks := ticksMost
	mu.Unlock()
	if queuedRan {
		t.Errorf("a task of another kind started beside the handler holding the only slot")
	}
	if mostTicks > consumer.InstantSlots || mostTicks < 2 {
		t.Errorf("at most %d instant tasks ran at once, want 2 to %d", mostTicks, consumer.InstantSlots)
	}
	if doc := e.get("long"); doc.State != task.StateRunning {
		t.Fatalf("long is %s: want it still running, holding the slot", doc.State)
	}
	close(release)
	e.waitState("queued", task.StateSucceeded)
	mu.Lock()
	defer mu.Unlock()
	if slotMost != 1 {
		t.Errorf("%d handlers of the slotted kind ran at once, Concurrency 1", slotMost)
	}
}
