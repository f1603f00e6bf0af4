// locks.go checks resource locks, also between two instances of one
// worker id.

package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func (s suite) locks(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	A := task.Holder{TaskKey: "ta", WorkerID: "wa", Attempt: 1}
	B := task.Holder{TaskKey: "tb", WorkerID: "wb", Attempt: 1}
	C := task.Holder{TaskKey: "tc", WorkerID: "wc", Attempt: 1}
	untilA := now.Add(time.Minute)
	lock := func(h task.Holder, at, until time.Time, keys ...string) error {
		return st.AcquireLocks(ctx, task.LockParams{Keys: keys, Holder: h, Now: at, Until: until})
	}
	locked := func(what string, err error, key string, h task.Holder, until time.Time) {
		t.Helper()
		var le *task.LockedError
		if !errors.As(err, &le) || !errors.Is(err, task.ErrLocked) {
			t.Fatalf("%s: %v; want a *task.LockedError", what, err)
		}
		if le.Key != key || le.Holder != h || !le.Until.Truncate(time.Millisecond).Equal(until) {
			t.Fatalf("%s: LockedError{%s %+v %s}; want {%s %+v %s}", what, le.Key, le.Holder, le.Until, key, h, until)
		}
	}
	if err := lock(A, now, untilA, "k1", "k2"); err != nil {
		t.Fatalf("A acquires k1, k2: %v", err)
	}
	locked("B on k2", lock(B, now, now.Add(time.Minute), "k2"), "k2", A, untilA)
	locked("B on free, k1", lock(B, now, now.Add(time.Minute), "free", "k1"), "k1", A, untilA)
	if err := lock(C, now, now.Add(time.Minute), "free"); err != nil {
		t.Fatalf("C on free after B's failed call: %v (B's call was not all-or-nothing)", err)
	}
	otherAttempt := A
	otherAttempt.Attempt = 2
	locked("A's next attempt on k1", lock(otherAttempt, now, now.Add(time.Minute), "k1"), "k1", A, untilA)

	// Renew: A's lease moves later.
	untilA2 := now.Add(2 * time.Minute)
	if err := lock(A, now, untilA2, "k1", "k2"); err != nil {
		t.Fatalf("A renews: %v", err)
	}
	locked("B between A's old and new Until", lock(B, untilA.Add(time.Second), untilA2.Add(time.Minute), "k1"), "k1", A, untilA2)

	// A's lease passes: B takes k1.
	if err := lock(B, untilA2, untilA2.Add(time.Minute), "k1"); err != nil {
		t.Fatalf("B on k1 at A's Until: %v", err)
	}
	locked("A on k1 after B took it", lock(A, untilA2, untilA2.Add(time.Minute), "k1"), "k1", B, untilA2.Add(time.Minute))

	// Release: only the holder frees.
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"k2"}, Holder: C}); err != nil {
		t.Fatalf("C releases k2: %v", err)
	}
	locked("B on k2 after a non-holder released it", lock(B, now, now.Add(time.Minute), "k2"), "k2", A, untilA2)
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"k2"}, Holder: A}); err != nil {
		t.Fatalf("A releases k2: %v", err)
	}
	if err := lock(B, now, now.Add(time.Minute), "k2"); err != nil {
		t.Fatalf("B on k2 after A released it: %v", err)
	}
}

// lockInstances checks that two processes under one worker id, differing
// only in instance, never renew or release each other's locks.
func (s suite) lockInstances(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	first := task.Holder{TaskKey: "t", WorkerID: "dup", Attempt: 1, Instance: "i1"}
	second := first
	second.Instance = "i2"
	until := now.Add(time.Minute)
	if err := st.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: first, Now: now, Until: until}); err != nil {
		t.Fatalf("first acquires: %v", err)
	}
	var le *task.LockedError
	err := st.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: second, Now: now, Until: until.Add(time.Minute)})
	if !errors.As(err, &le) || le.Holder != first {
		t.Fatalf("second instance renews the first's lock: %v; want a *task.LockedError naming %+v", err, first)
	}
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: second}); err != nil {
		t.Fatalf("second instance releases: %v", err)
	}
	err = st.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: task.Holder{TaskKey: "u", WorkerID: "w"}, Now: now, Until: until})
	if !errors.As(err, &le) || le.Holder != first {
		t.Fatalf("after the second instance's release, a third takes the lock: %v; want it still held by %+v", err, first)
	}
}
