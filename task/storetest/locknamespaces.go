// locknamespaces.go checks that lock namespaces hold keys apart: holders,
// releases, expiry and lines of one namespace never touch another's, and
// what an upgrade from a store without namespaces must keep.

package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// lockNamespaces checks that one key in two namespaces names two leases: a
// task's lock key "rate:x#0" and the rate-limit slot "x#0" are both held,
// by different holders, as are one key in every namespace; releases and
// expiry act in their own namespace; lines and heirs too.
func (s suite) lockNamespaces(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	user := task.Holder{TaskKey: "user", WorkerID: "wu", Attempt: 1}
	slot := task.Holder{TaskKey: "limited", WorkerID: "wr", Attempt: 1}
	single := task.Holder{TaskKey: "reconciler", WorkerID: "ws"}
	other := task.Holder{TaskKey: "other", WorkerID: "wo", Attempt: 1}
	until := now.Add(time.Minute)
	take := func(ns task.LockNamespace, h task.Holder, at, until time.Time, key string) error {
		return st.AcquireLocks(ctx, task.LockParams{Namespace: ns, Keys: []string{key}, Holder: h, Now: at, Until: until})
	}
	release := func(ns task.LockNamespace, h task.Holder, key string) {
		t.Helper()
		if err := st.ReleaseLocks(ctx, task.LockParams{Namespace: ns, Keys: []string{key}, Holder: h}); err != nil {
			t.Fatalf("%s releases %s in %q: %v", h.TaskKey, key, ns, err)
		}
	}
	ok := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	ok("user takes the task lock rate:x#0", take(task.LockTask, user, now, until, "rate:x#0"))
	ok("the limit takes its slot x#0", take(task.LockRate, slot, now, until, "x#0"))
	ok("other takes the task lock x#0", take(task.LockTask, other, now, until, "x#0"))
	ok("a singleton takes x#0", take(task.LockSingleton, single, now, until, "x#0"))
	lockedIn(t, "other on the slot x#0", take(task.LockRate, other, now, until, "x#0"), task.LockRate, "x#0", slot, until)
	lockedIn(t, "other on the task lock rate:x#0", take(task.LockTask, other, now, until, "rate:x#0"), task.LockTask, "rate:x#0", user, until)
	lockedIn(t, "user on the task lock x#0", take(task.LockTask, user, now, until, "x#0"), task.LockTask, "x#0", other, until)
	lockedIn(t, "other on the singleton x#0", take(task.LockSingleton, other, now, until, "x#0"), task.LockSingleton, "x#0", single, until)

	// A release frees its own namespace's key only, by its holder only.
	release(task.LockTask, slot, "x#0")
	release(task.LockRate, other, "x#0")
	lockedIn(t, "user on x#0 after the slot's holder released x#0 among tasks' keys", take(task.LockTask, user, now, until, "x#0"), task.LockTask, "x#0", other, until)
	lockedIn(t, "user on the slot after other released x#0 among slots", take(task.LockRate, user, now, until, "x#0"), task.LockRate, "x#0", slot, until)
	release(task.LockTask, other, "x#0")
	ok("user on x#0 after other released it", take(task.LockTask, user, now, until, "x#0"))
	lockedIn(t, "other on the slot after x#0 changed hands among tasks' keys", take(task.LockRate, other, now, until, "x#0"), task.LockRate, "x#0", slot, until)

	// Expiry: a short slot lapses while the task lock of the same key holds.
	short := now.Add(time.Second)
	ok("the limit takes the slot y for a second", take(task.LockRate, slot, now, short, "y"))
	ok("user takes the task lock y for a minute", take(task.LockTask, user, now, until, "y"))
	ok("other takes the slot y when it lapsed", take(task.LockRate, other, short, until, "y"))
	lockedIn(t, "other on the task lock y then", take(task.LockTask, other, short, until, "y"), task.LockTask, "y", user, until)

	// Lines: hi waits for dev among tasks' keys; a caller in line for dev
	// among singletons does not see hi's place, nor the reverse; heirs
	// enter the released key's namespace only.
	l := newLineTest(t, st)
	l.ok("hold takes dev", l.tryIn(task.LockTask, "hold", now, "dev"))
	l.stopped("hi while held", l.tryIn(task.LockTask, "hi", now, "dev"), false, "hold")
	l.ok("lo takes dev among singletons past hi's place among tasks' keys", l.tryIn(task.LockSingleton, "lo", now, "dev"))
	l.releaseIn(task.LockTask, "hold", "dev")
	l.stopped("lo among tasks' keys with hi in line", l.tryIn(task.LockTask, "lo", now, "dev"), true, "hi")
	l.ok("hi takes dev", l.tryIn(task.LockTask, "hi", now, "dev"))

	l.ok("hold takes dev2 among singletons", l.tryIn(task.LockSingleton, "hold", now, "dev2"))
	heir := task.LinePlace{LockKey: "dev2", TaskKey: "hi", LockLine: task.LockLine{Priority: l.prio["hi"], Seq: l.seq["hi"], Until: now.Add(time.Minute)}}
	err := st.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: []string{"dev2"}, Holder: l.holder("hold"), Now: now, Heirs: []task.LinePlace{heir}})
	ok("hold releases dev2 to its heir hi", err)
	l.stopped("lo among singletons with the heir hi in line", l.tryIn(task.LockSingleton, "lo", now, "dev2"), true, "hi")
	l.ok("lo takes dev2 among tasks' keys, where hi has no place", l.tryIn(task.LockTask, "lo", now, "dev2"))

	// A NUL byte, which a store may join a namespace to a key with, is refused.
	for _, p := range []task.LockParams{
		{Namespace: "a\x00b", Keys: []string{"k"}, Holder: user, Now: now, Until: until},
		{Namespace: task.LockRate, Keys: []string{"k\x00"}, Holder: user, Now: now, Until: until},
	} {
		if err := st.AcquireLocks(ctx, p); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("AcquireLocks in %q of %q: %v; want ErrInvalid", p.Namespace, p.Keys, err)
		}
		if err := st.ReleaseLocks(ctx, p); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("ReleaseLocks in %q of %q: %v; want ErrInvalid", p.Namespace, p.Keys, err)
		}
	}
}

// lockedIn fails t unless err is a *task.LockedError naming key in ns,
// held by h until until.
func lockedIn(t *testing.T, what string, err error, ns task.LockNamespace, key string, h task.Holder, until time.Time) {
	t.Helper()
	var le *task.LockedError
	if !errors.As(err, &le) || !errors.Is(err, task.ErrLocked) {
		t.Fatalf("%s: %v; want a *task.LockedError", what, err)
	}
	if le.Namespace != ns || le.Key != key || le.Holder != h || !le.Until.Truncate(time.Millisecond).Equal(until) {
		t.Fatalf("%s: LockedError{%q %s %+v %s}; want {%q %s %+v %s}", what, le.Namespace, le.Key, le.Holder, le.Until, ns, key, h, until)
	}
}

// tryIn takes lockKey in ns for key's task at at, in line with a place
// lasting a minute.
func (l *lineTest) tryIn(ns task.LockNamespace, key string, at time.Time, lockKey string) error {
	return l.st.AcquireLocks(l.ctx, task.LockParams{Namespace: ns, Keys: []string{lockKey}, Holder: l.holder(key), Now: at, Until: at.Add(time.Minute),
		Line: &task.LockLine{Priority: l.prio[key], Seq: l.seq[key], Until: at.Add(time.Minute)}})
}

func (l *lineTest) releaseIn(ns task.LockNamespace, key, lockKey string) {
	l.t.Helper()
	if err := l.st.ReleaseLocks(l.ctx, task.LockParams{Namespace: ns, Keys: []string{lockKey}, Holder: l.holder(key)}); err != nil {
		l.t.Fatalf("%s releases %s in %q: %v", key, lockKey, ns, err)
	}
}

// UpgradedLocks checks st, opened on a store written before lock
// namespaces (testdata fixtures of both backends) that held, until 2199:
// the task lock device:1 by task job (worker w1, attempt 1, instance i1),
// with task waiter (priority 5) in its line; the rate-limit slot
// rate:kind:k#0 by task limited (w1, attempt 1, i1); and the singletons'
// leases leasepool.flow-reconcile, leasepool.retention and
// mqtt-broker:127.0.0.1:1883, each by the holder named like it (w1,
// instance i-KEY). After the upgrade the slot is kind:k#0 among slots and
// the leases are among singletons, held as before, their old names are
// free among tasks' keys, and device:1 and its line are kept.
func UpgradedLocks(t *testing.T, st task.Store) {
	t.Helper()
	ctx := ctxFor(t)
	now := st.Now()
	until := time.Date(2199, 1, 1, 0, 0, 0, 0, time.UTC)
	other := task.Holder{TaskKey: "other", WorkerID: "w9", Attempt: 1}
	take := func(ns task.LockNamespace, h task.Holder, key string, line *task.LockLine) error {
		return st.AcquireLocks(ctx, task.LockParams{Namespace: ns, Keys: []string{key}, Holder: h, Now: now, Until: now.Add(time.Minute), Line: line})
	}
	limited := task.Holder{TaskKey: "limited", WorkerID: "w1", Attempt: 1, Instance: "i1"}
	lockedIn(t, "other on the slot kind:k#0", take(task.LockRate, other, "kind:k#0", nil), task.LockRate, "kind:k#0", limited, until)
	if err := take(task.LockRate, limited, "kind:k#0", nil); err != nil {
		t.Fatalf("the slot's holder renews kind:k#0 among slots: %v", err)
	}
	if err := take(task.LockTask, other, "rate:kind:k#0", nil); err != nil {
		t.Fatalf("a task takes the lock key rate:kind:k#0: %v", err)
	}
	for _, k := range []string{"leasepool.flow-reconcile", "leasepool.retention", "mqtt-broker:127.0.0.1:1883"} {
		h := task.Holder{TaskKey: k, WorkerID: "w1", Instance: "i-" + k}
		lockedIn(t, "other on the singleton "+k, take(task.LockSingleton, other, k, nil), task.LockSingleton, k, h, until)
		if err := take(task.LockTask, other, k, nil); err != nil {
			t.Fatalf("a task takes the lock key %s: %v", k, err)
		}
	}
	job := task.Holder{TaskKey: "job", WorkerID: "w1", Attempt: 1, Instance: "i1"}
	lockedIn(t, "other on device:1", take(task.LockTask, other, "device:1", nil), task.LockTask, "device:1", job, until)
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"device:1"}, Holder: job}); err != nil {
		t.Fatalf("job releases device:1: %v", err)
	}
	lim, err := st.Get(ctx, "limited")
	if err != nil {
		t.Fatal(err)
	}
	var le *task.LockedError
	err = take(task.LockTask, limited, "device:1", &task.LockLine{Priority: lim.Priority, Seq: lim.Seq, Until: now.Add(time.Minute)})
	if !errors.As(err, &le) || !le.Ahead || le.Holder.TaskKey != "waiter" {
		t.Fatalf("limited on device:1 after its release: %v; want task waiter ahead in line", err)
	}
	w, err := st.Get(ctx, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	waiter := task.Holder{TaskKey: "waiter", WorkerID: "w2", Attempt: 1, Instance: "i2"}
	if err := take(task.LockTask, waiter, "device:1", &task.LockLine{Priority: w.Priority, Seq: w.Seq, Until: now.Add(time.Minute)}); err != nil {
		t.Fatalf("waiter, first in line, takes device:1: %v", err)
	}
}
