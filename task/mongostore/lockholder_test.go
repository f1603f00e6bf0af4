package mongostore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// TestLockHolder: LockHolder names the holder of a key and its lease's
// end in its own namespace only, and none once it is released; calls
// asking for a read sent since one instant share one read, and a call
// asking for a later one reads again and sees what changed.
func TestLockHolder(t *testing.T) {
	t.Parallel()
	var finds atomic.Int64
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "find" {
			finds.Add(1)
		}
	}}
	st := open(t, testservers.MongoURI(t), mongostore.Config{Database: freshDB(), Monitor: mon})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Database().Drop(ctx)
	})
	ctx := context.Background()
	holder := task.Holder{TaskKey: "k", WorkerID: "w", Instance: "i1"}
	p := task.LockParams{Namespace: task.LockSingleton, Keys: []string{"k"}, Holder: holder, Now: st.Now()}
	p.Until = p.Now.Add(time.Minute)
	check := func(ns task.LockNamespace, key string, since time.Time, wantHolder task.Holder, wantUntil time.Time) {
		t.Helper()
		h, until, err := st.LockHolder(ctx, ns, key, since)
		if err != nil {
			t.Fatal(err)
		}
		if h != wantHolder || !until.Equal(wantUntil) {
			t.Errorf("LockHolder(%q, %q) = %+v until %s, want %+v until %s", ns, key, h, until, wantHolder, wantUntil)
		}
	}
	check(task.LockSingleton, "k", time.Now(), task.Holder{}, time.Time{})
	if err := st.AcquireLocks(ctx, p); err != nil {
		t.Fatal(err)
	}
	other := p
	other.Keys, other.Holder = []string{"k2"}, task.Holder{TaskKey: "k2", WorkerID: "w2", Instance: "i2"}
	if err := st.AcquireLocks(ctx, other); err != nil {
		t.Fatal(err)
	}
	// A task lock of the same name is another lock, read on its own.
	if err := st.AcquireLocks(ctx, task.LockParams{Keys: []string{"k"}, Holder: task.Holder{TaskKey: "t", WorkerID: "w3"}, Now: p.Now, Until: p.Until}); err != nil {
		t.Fatal(err)
	}
	until := p.Until.UTC().Truncate(time.Millisecond)
	since := time.Now()
	before := finds.Load()
	check(task.LockSingleton, "k", since, holder, until)
	check(task.LockSingleton, "k2", since, other.Holder, until)
	check(task.LockSingleton, "absent", since, task.Holder{}, time.Time{})
	if n := finds.Load() - before; n != 1 {
		t.Errorf("%d finds for three looks since one instant, want 1", n)
	}
	check(task.LockTask, "k", since, task.Holder{TaskKey: "t", WorkerID: "w3"}, until)

	if err := st.ReleaseLocks(ctx, p); err != nil {
		t.Fatal(err)
	}
	check(task.LockSingleton, "k", since, holder, until) // the shared read, sent before the release
	check(task.LockSingleton, "k", time.Now(), task.Holder{}, time.Time{})

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := st.LockHolder(cctx, task.LockSingleton, "k", time.Now()); !errors.Is(err, context.Canceled) {
		t.Errorf("LockHolder with a cancelled context: %v, want context.Canceled", err)
	}
}
