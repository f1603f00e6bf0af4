// locks.go checks resource locks, also between two instances of one
// worker id.

package storetest

import (
	"context"
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

// lockLines checks that callers giving a task.LockLine are served in line
// order (priority, then publish order) whoever they are, that a place
// lapses, that a finished task's place never blocks, that the holder's
// renewal passes the line, and that callers without a line ignore it.
func (s suite) lockLines(t *testing.T) {
	l := newLineTest(t, s.store(t))
	now := l.now
	// "hold" holds dev; lo, then hi, queue behind it.
	l.ok("hold takes dev", l.try("hold", now, time.Minute, "dev"))
	l.stopped("lo while held", l.try("lo", now, time.Minute, "dev"), false, "hold")
	l.stopped("hi while held", l.try("hi", now, time.Minute, "dev"), false, "hold")
	l.stopped("lo2 while held", l.try("lo2", now, time.Minute, "dev"), false, "hold")
	l.release("hold", "dev")
	// Freed: hi ranks first, then lo before lo2 (same priority, published first).
	l.stopped("lo with hi waiting", l.try("lo", now, time.Minute, "dev"), true, "hi")
	l.stopped("lo2 with hi waiting", l.try("lo2", now, time.Minute, "dev"), true, "hi")
	l.ok("hi takes dev", l.try("hi", now, time.Minute, "dev"))
	l.release("hi", "dev")
	l.stopped("lo2 with lo waiting", l.try("lo2", now, time.Minute, "dev"), true, "lo")
	l.ok("lo takes dev", l.try("lo", now, time.Minute, "dev"))
	l.release("lo", "dev")
	l.ok("lo2 takes dev (hi and lo left the line when they took it)", l.try("lo2", now, time.Minute, "dev"))
	l.release("lo2", "dev")

	// A place lapses at its Until.
	l.ok("hold takes dev2", l.try("hold", now, time.Minute, "dev2"))
	l.stopped("late-hi while held", l.try("late-hi", now, time.Second, "dev2"), false, "hold")
	l.release("hold", "dev2")
	l.stopped("lo before late-hi's place lapses", l.try("lo", now, time.Minute, "dev2"), true, "late-hi")
	l.ok("lo after late-hi's place lapsed", l.try("lo", now.Add(2*time.Second), time.Minute, "dev2"))

	// A cancelled task's place never stands ahead.
	l.ok("hold takes dev3", l.try("hold", now, time.Minute, "dev3"))
	l.stopped("gone while held", l.try("gone", now, time.Minute, "dev3"), false, "hold")
	l.release("hold", "dev3")
	if _, err := task.Cancel(l.ctx, l.st, "gone"); err != nil {
		t.Fatal(err)
	}
	l.ok("lo2 after gone was cancelled", l.try("lo2", now, time.Minute, "dev3"))

	// A task stopped on one of its keys keeps its rank on the others.
	l.ok("hold takes x", l.try("hold", now, time.Minute, "x"))
	if err := l.st.AcquireLocks(l.ctx, task.LockParams{Keys: []string{"x", "y"}, Holder: l.holder("hi"), Now: now, Until: now.Add(time.Minute),
		Line: &task.LockLine{Priority: l.prio["hi"], Seq: l.seq["hi"], Until: now.Add(time.Minute)}}); err == nil {
		t.Fatal("hi took x and y while hold held x")
	}
	l.stopped("lo on y while hi waits for x and y", l.try("lo", now, time.Minute, "y"), true, "hi")
	l.release("hold", "x")

	// The holder renews past a better place; a caller without a line ignores it.
	l.ok("renewer takes dev4", l.try("renewer", now, time.Minute, "dev4"))
	l.stopped("hi while renewer holds", l.try("hi", now, time.Minute, "dev4"), false, "renewer")
	l.ok("renewer renews", l.try("renewer", now.Add(time.Second), time.Minute, "dev4"))
	l.release("renewer", "dev4")
	l.ok("no line: takes dev4 with hi waiting", l.st.AcquireLocks(l.ctx, task.LockParams{Keys: []string{"dev4"}, Holder: l.holder("x"), Now: now, Until: now.Add(time.Minute)}))

	// A release enters its heirs' places before the key is free: hi, which
	// waited in the holder's process, ranks ahead of lo, already in line.
	l.ok("hold takes dev5", l.try("hold", now, time.Minute, "dev5"))
	l.stopped("lo while held", l.try("lo", now, time.Minute, "dev5"), false, "hold")
	heir := task.LinePlace{LockKey: "dev5", TaskKey: "hi", LockLine: task.LockLine{Priority: l.prio["hi"], Seq: l.seq["hi"], Until: now.Add(time.Minute)}}
	if err := l.st.ReleaseLocks(l.ctx, task.LockParams{Keys: []string{"dev5"}, Holder: l.holder("hold"), Now: now, Heirs: []task.LinePlace{heir}}); err != nil {
		t.Fatalf("hold releases dev5 to its heir: %v", err)
	}
	l.stopped("lo with the heir hi waiting", l.try("lo", now, time.Minute, "dev5"), true, "hi")
	l.ok("hi takes dev5", l.try("hi", now, time.Minute, "dev5"))
}

// lineTest is a store with tasks of several priorities that try lock keys
// in line.
type lineTest struct {
	t    *testing.T
	st   task.Store
	ctx  context.Context
	now  time.Time
	seq  map[string]int64
	prio map[string]int
}

func newLineTest(t *testing.T, st task.Store) *lineTest {
	l := &lineTest{t: t, st: st, ctx: ctxFor(t), now: st.Now().Truncate(time.Millisecond), seq: map[string]int64{}, prio: map[string]int{}}
	for _, p := range []struct {
		key      string
		priority int
	}{{"lo", 1}, {"hi", 5}, {"lo2", 1}, {"late-hi", 9}, {"gone", 9}, {"renewer", 0}} {
		stored, _, err := task.Publish(l.ctx, st, task.PublishParams{Key: p.key, Kind: "k", Options: task.Options{Priority: p.priority}})
		if err != nil {
			t.Fatalf("publish %s: %v", p.key, err)
		}
		l.seq[p.key], l.prio[p.key] = stored.Seq, p.priority
	}
	return l
}

func (l *lineTest) holder(key string) task.Holder {
	return task.Holder{TaskKey: key, WorkerID: "w-" + key, Attempt: 1}
}

// try takes lockKey for key's task at at, in line with a place lasting placeFor.
func (l *lineTest) try(key string, at time.Time, placeFor time.Duration, lockKey string) error {
	return l.st.AcquireLocks(l.ctx, task.LockParams{Keys: []string{lockKey}, Holder: l.holder(key), Now: at, Until: at.Add(time.Minute),
		Line: &task.LockLine{Priority: l.prio[key], Seq: l.seq[key], Until: at.Add(placeFor)}})
}

func (l *lineTest) release(key, lockKey string) {
	l.t.Helper()
	if err := l.st.ReleaseLocks(l.ctx, task.LockParams{Keys: []string{lockKey}, Holder: l.holder(key)}); err != nil {
		l.t.Fatalf("%s releases %s: %v", key, lockKey, err)
	}
}

func (l *lineTest) stopped(what string, err error, ahead bool, by string) {
	l.t.Helper()
	var le *task.LockedError
	if !errors.As(err, &le) || le.Ahead != ahead || le.Holder.TaskKey != by {
		l.t.Fatalf("%s: %v; want a *task.LockedError by %s (ahead %v)", what, err, by, ahead)
	}
}

func (l *lineTest) ok(what string, err error) {
	l.t.Helper()
	if err != nil {
		l.t.Fatalf("%s: %v", what, err)
	}
}
