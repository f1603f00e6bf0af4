package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// TestLockKeysNamedLikeRateSlotsRunUnderALimit: while a limit of one
// start a minute on device:* holds its slot, a task whose lock keys are
// named like that slot ("rate:lock:device:a#0") and like the limit's own
// turn in the worker ("rate:lock:device:a") runs at once, and the next
// task counted in the limit still waits. The slot lives in
// task.LockRate, held by the first start.
func TestLockKeysNamedLikeRateSlotsRunUnderALimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	if err := control.SetLimit(ctx, e.store, control.Limit{Target: control.Lock("device:*"), N: 1, Per: time.Minute}); err != nil {
		t.Fatal(err)
	}
	e.worker("A", func(context.Context, *consumer.Job) error { return nil })
	e.publish("first", lockKeys("device:a"))
	first := e.waitState("first", task.StateSucceeded)
	e.publish("second", lockKeys("device:a"))
	e.publish("user", lockKeys("rate:lock:device:a#0", "rate:lock:device:a"))
	e.waitState("user", task.StateSucceeded)
	if doc := e.get("second"); doc.State != task.StatePending || len(doc.Attempts) != 0 {
		t.Fatalf("second is %s with workers %+v under the limit; want pending, never claimed", doc.State, doc.Attempts)
	}
	now := e.store.Now()
	err := e.store.AcquireLocks(ctx, task.LockParams{Namespace: task.LockRate, Keys: []string{"lock:device:a#0"},
		Holder: task.Holder{TaskKey: "probe", WorkerID: "probe"}, Now: now, Until: now.Add(time.Second)})
	var le *task.LockedError
	if !errors.As(err, &le) || le.Holder != first.Attempts[0].Holder(first.Key) {
		t.Fatalf("the slot lock:device:a#0 among rate slots: %v; want it held by first's attempt", err)
	}
}
