package events_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/internal/tasktest"
	"github.com/leasepool/leasepool/task"
)

// got is the part of an event the derivation tests compare.
type got struct {
	Type, Worker string
	Attempt      int
	By, Error    string
	Until        time.Time
	State        task.State
}

func summary(evs []events.Event) []got {
	var out []got
	for _, e := range evs {
		out = append(out, got{e.Type, e.Worker, e.Attempt, e.By, e.Error, e.Until, e.State})
	}
	return out
}

// write applies fn as one store write would: the mutation sees the stored
// version, the store then bumps it.
func write(t *testing.T, tk *task.Task, fn func(tk *task.Task) error) *task.Task {
	t.Helper()
	next := tk.Clone()
	if err := fn(next); err != nil {
		t.Fatal(err)
	}
	next.Version++
	return next
}

func TestDeriveEachMutation(t *testing.T) {
	t.Parallel()
	t0 := tasktest.T0
	now := t0.Add(time.Second)
	a1 := task.Holder{TaskKey: "k", WorkerID: "a", Attempt: 1}
	running := func() *task.Task {
		tk := tasktest.New(t, nil, tasktest.Running("a", 1, t0.Add(4*time.Second)))
		tk.Version = 7
		return tk
	}
	later := t0.Add(time.Hour)
	tests := []struct {
		name  string
		start func() *task.Task
		fn    func(tk *task.Task) error
		want  []got
	}{
		{"claim", func() *task.Task { tk := tasktest.New(t, nil); tk.Version = 3; return tk },
			func(tk *task.Task) error { tk.Claim(task.Holder{WorkerID: "b"}, now); return nil },
			[]got{{Type: events.Claimed, Worker: "b", Attempt: 1, State: task.StateRunning}}},
		{"take over", running,
			func(tk *task.Task) error { tk.Claim(task.Holder{WorkerID: "b"}, t0.Add(5*time.Second)); return nil },
			[]got{{Type: events.Expired, Worker: "a", Attempt: 1, By: "b", Error: "lease expired", State: task.StateRunning},
				{Type: events.Claimed, Worker: "b", Attempt: 2, State: task.StateRunning}}},
		{"reap fails the task", func() *task.Task {
			tk := tasktest.New(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries }, tasktest.Running("a", 1, t0.Add(time.Second)))
			tk.Version = 2
			return tk
		}, func(tk *task.Task) error { tk.Reap(t0.Add(2 * time.Second)); return nil },
			[]got{{Type: events.Expired, Worker: "a", Attempt: 1, Error: "lease expired", State: task.StateFailed}}},
		{"succeed", running, func(tk *task.Task) error { return tk.Succeed(a1, now) },
			[]got{{Type: events.Succeeded, Worker: "a", Attempt: 1, State: task.StateSucceeded}}},
		{"fail and retry", running, func(tk *task.Task) error { return tk.Fail(a1, "boom", later, now) },
			[]got{{Type: events.Failed, Worker: "a", Attempt: 1, Error: "boom", State: task.StatePending},
				{Type: events.Retried, Worker: "a", Attempt: 1, Until: later, State: task.StatePending}}},
		{"fail for good", func() *task.Task {
			tk := tasktest.New(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries }, tasktest.Running("a", 1, t0.Add(4*time.Second)))
			tk.Version = 2
			return tk
		}, func(tk *task.Task) error { return tk.Fail(a1, "boom", later, now) },
			[]got{{Type: events.Failed, Worker: "a", Attempt: 1, Error: "boom", State: task.StateFailed}}},
		{"release", running, func(tk *task.Task) error { return tk.Release(a1, now) },
			[]got{{Type: events.Released, Worker: "a", Attempt: 1, State: task.StatePending}}},
		{"snooze", running, func(tk *task.Task) error { return tk.Snooze(a1, later, now) },
			[]got{{Type: events.Snoozed, Worker: "a", Attempt: 1, Until: later, State: task.StatePending}}},
		{"unpin", running, func(tk *task.Task) error {
			tk.SpecificWorkerIDs = []string{"b"}
			tk.Unpin(a1, now)
			return nil
		}, []got{{Type: events.Unpinned, Worker: "a", Attempt: 1, State: task.StatePending}}},
		{"cancel", running, func(tk *task.Task) error { return tk.Cancel(now) },
			[]got{{Type: events.Cancelled, State: task.StateCancelled}}},
		{"reset", func() *task.Task {
			tk := tasktest.New(t, nil, tasktest.Ended("a", 1, task.AttemptSuccess))
			tk.Version = 4
			return tk
		}, func(tk *task.Task) error { return tk.Reset(now) },
			[]got{{Type: events.Reset, Until: now, State: task.StatePending}}},
		{"renewal: no event", running, func(tk *task.Task) error { return tk.Renew(a1, now) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tk := write(t, tc.start(), tc.fn)
			evs := events.Derive(tk)
			if g := summary(evs); !reflect.DeepEqual(g, tc.want) {
				t.Fatalf("events\n got %+v\nwant %+v", g, tc.want)
			}
			for _, e := range evs {
				if e.Key != "k" || e.Kind != "noop" || e.Version != tk.Version || !e.At.Equal(tk.UpdatedAt) {
					t.Errorf("event %+v: want key k, kind noop, version %d, at %s", e, tk.Version, tk.UpdatedAt)
				}
			}
			// The next write that changes nothing of the lifecycle (here an
			// option edit) must not repeat these events.
			if again := events.Derive(write(t, tk, func(tk *task.Task) error { tk.Priority++; return nil })); len(again) != 0 {
				t.Errorf("a later write repeats %+v", summary(again))
			}
		})
	}
}

func TestDerivePublishAndReserved(t *testing.T) {
	t.Parallel()
	tk := tasktest.New(t, nil)
	tk.Version = 1
	if g := summary(events.Derive(tk)); len(g) != 1 || g[0].Type != events.Published || g[0].State != task.StatePending {
		t.Errorf("version 1: %+v, want one published", g)
	}
	tk.Key = "leasepool:control"
	if g := events.Derive(tk); len(g) != 0 {
		t.Errorf("doorbell: %+v, want none", g)
	}
	if g := events.Derive(nil); len(g) != 0 {
		t.Errorf("nil: %+v", g)
	}
}

// A later document tells the claims of an earlier write exactly as the
// claim's own document does, wherever the attempt has gone since (a rerun
// moves it to History); other writes' versions yield none.
func TestDeriveClaimsFromALaterDocument(t *testing.T) {
	t.Parallel()
	now := tasktest.T0.Add(time.Second)
	tk := tasktest.New(t, nil)
	tk.Version = 3
	var h task.Holder
	claimed := write(t, tk, func(tk *task.Task) error { h = tk.Claim(task.Holder{WorkerID: "b", Instance: "ib"}, now); return nil })
	own := events.Derive(claimed)
	if len(own) != 1 || own[0].Type != events.Claimed {
		t.Fatalf("the claim's own document: %+v", own)
	}
	done := write(t, claimed, func(tk *task.Task) error { return tk.Succeed(h, now.Add(time.Millisecond)) })
	rerun := write(t, done, func(tk *task.Task) error { return tk.Reset(now.Add(time.Second)) })
	for _, later := range []*task.Task{done, rerun} {
		if got := events.DeriveClaims(later, claimed.Version); !reflect.DeepEqual(got, own) {
			t.Errorf("from version %d: %+v, want %+v", later.Version, got, own)
		}
		for _, v := range []int64{1, done.Version, rerun.Version, 99} {
			if got := events.DeriveClaims(later, v); got != nil {
				t.Errorf("from version %d, the claims of version %d: %+v, want none", later.Version, v, got)
			}
		}
	}
	reserved := done.Clone()
	reserved.Key = events.ReservedPrefix + "x"
	if got := events.DeriveClaims(reserved, claimed.Version); got != nil {
		t.Errorf("reserved key: %+v", got)
	}
}
