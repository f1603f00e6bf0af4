package mongostore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
)

// TestLockHolder: LockHolder names the holder of a key and its lease's
// end in its own namespace only, and none once it is released.
func TestLockHolder(t *testing.T) {
	t.Parallel()
	st, _ := openFresh(t, testservers.MongoURI(t))
	ctx := context.Background()
	holder := task.Holder{TaskKey: "k", WorkerID: "w", Instance: "i1"}
	p := task.LockParams{Namespace: task.LockSingleton, Keys: []string{"k"}, Holder: holder, Now: st.Now()}
	p.Until = p.Now.Add(time.Minute)
	check := func(ns task.LockNamespace, wantHolder task.Holder, wantUntil time.Time) {
		t.Helper()
		h, until, err := st.LockHolder(ctx, ns, "k")
		if err != nil {
			t.Fatal(err)
		}
		if h != wantHolder || !until.Equal(wantUntil) {
			t.Errorf("LockHolder(%q) = %+v until %s, want %+v until %s", ns, h, until, wantHolder, wantUntil)
		}
	}
	check(task.LockSingleton, task.Holder{}, time.Time{})
	if err := st.AcquireLocks(ctx, p); err != nil {
		t.Fatal(err)
	}
	check(task.LockSingleton, holder, p.Until.UTC().Truncate(time.Millisecond))
	check(task.LockTask, task.Holder{}, time.Time{})
	if err := st.ReleaseLocks(ctx, p); err != nil {
		t.Fatal(err)
	}
	check(task.LockSingleton, task.Holder{}, time.Time{})

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := st.LockHolder(cctx, task.LockSingleton, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("LockHolder with a cancelled context: %v, want context.Canceled", err)
	}
}
