// watch.go checks change streams: events for every write, resuming from
// a token, across handles, and ending on Close or a cancelled context.

package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// watch opens a change stream, skipping when the backend declared it
// cannot push and failing on ErrWatchUnsupported otherwise.
func watch(t *testing.T, o Opened, st task.Store, p task.WatchParams) task.ChangeStream {
	t.Helper()
	cs, err := st.Watch(t.Context(), p)
	if errors.Is(err, task.ErrWatchUnsupported) {
		if o.NoWatch != "" {
			t.Skipf("no change streams: %s", o.NoWatch)
		}
		t.Fatalf("Watch: %v, and Opened.NoWatch does not declare it", err)
	}
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// next waits up to d for the next event.
func next(t *testing.T, cs task.ChangeStream, d time.Duration) task.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	ev, err := cs.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if ev.Key == "" || len(ev.Token) == 0 {
		t.Fatalf("event without key or token: %+v", ev)
	}
	return ev
}

// wait bounds each wait for a change event.
const wait = 10 * time.Second

func (s suite) watch(t *testing.T) {
	t.Run("SeesWrites", s.watchSeesWrites)
	t.Run("Resume", s.watchResume)
	t.Run("CrossHandle", s.watchCrossHandle)
	t.Run("Closed", s.watchClosed)
	t.Run("ContextCancel", s.watchContextCancel)
	t.Run("SkipQuiet", s.watchSkipQuiet)
}

func (s suite) watchSeesWrites(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	st := o.Store
	cs := watch(t, o, st, task.WatchParams{})
	mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
	for i := range 3 {
		mustModify(t, st, "a", func(tk *task.Task) error { tk.Priority = i + 1; return nil })
	}
	var last int64
	for v := int64(1); v <= 4; v++ {
		ev := next(t, cs, wait)
		if ev.Key != "a" {
			t.Fatalf("event %d for key %q; want a", v, ev.Key)
		}
		if ev.Task != nil {
			if ev.Task.Key != "a" || ev.Task.Version < v || ev.Task.Version < last {
				t.Fatalf("event %d carries key %q version %d (previous %d); want a, >= %d", v, ev.Task.Key, ev.Task.Version, last, v)
			}
			last = ev.Task.Version
		}
		if tok := cs.ResumeToken(); len(tok) == 0 {
			t.Fatalf("no resume token after event %d", v)
		}
	}
}

func (s suite) watchResume(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	st := o.Store
	cs := watch(t, o, st, task.WatchParams{})
	mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
	if ev := next(t, cs, wait); ev.Key != "a" {
		t.Fatalf("first event for %q; want a", ev.Key)
	}
	tok := cs.ResumeToken()
	cs.Close()
	mustInsert(t, st, newTask(t, "b", "k", st.Now(), task.Options{}))
	mustModify(t, st, "a", func(tk *task.Task) error { tk.Priority = 7; return nil })
	cs2 := watch(t, o, st, task.WatchParams{ResumeAfter: tok})
	if ev := next(t, cs2, wait); ev.Key != "b" {
		t.Fatalf("first event after resume for %q; want b", ev.Key)
	}
	ev := next(t, cs2, wait)
	if ev.Key != "a" || (ev.Task != nil && ev.Task.Version < 2) {
		t.Fatalf("second event after resume: %q %+v; want a at version 2", ev.Key, ev.Task)
	}
}

func (s suite) watchCrossHandle(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	if o.Reopen == nil {
		t.Skip("Opened.Reopen is nil")
	}
	other := o.Reopen(t)
	cs := watch(t, o, other, task.WatchParams{})
	start := time.Now()
	mustInsert(t, o.Store, newTask(t, "a", "k", o.Store.Now(), task.Options{}))
	ev := next(t, cs, 3*time.Second)
	if ev.Key != "a" {
		t.Fatalf("event for %q; want a", ev.Key)
	}
	t.Logf("cross-handle event after %s", time.Since(start))
	if got := mustGet(t, other, "a"); got.Version != 1 {
		t.Fatalf("other handle reads version %d", got.Version)
	}
}

func (s suite) watchClosed(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	cs := watch(t, o, o.Store, task.WatchParams{})
	if err := cs.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if _, err := cs.Next(ctx); err == nil {
		t.Fatal("Next on a closed stream returned no error")
	} else if ctx.Err() != nil {
		t.Fatalf("Next on a closed stream blocked until the deadline: %v", err)
	}
}

func (s suite) watchContextCancel(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	cs := watch(t, o, o.Store, task.WatchParams{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := cs.Next(ctx)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Next returned no error after ctx was cancelled")
		}
	case <-time.After(wait):
		t.Fatal("Next ignored ctx cancellation")
	}
	// The stream is still usable with a live context.
	mustInsert(t, o.Store, newTask(t, "a", "k", o.Store.Now(), task.Options{}))
	if ev := next(t, cs, wait); ev.Key != "a" {
		t.Logf("after a cancelled Next, event for %q", ev.Key)
	}
}

// watchSkipQuiet checks WatchParams.SkipQuiet: a holder's renewals are left
// out, the insert, the claim and the finish are not. (On MongoDB an event
// carries the document as read later, so a renewal read after the finish
// comes with the finished document: what the stream delivers after the
// claim is the finished task either way.)
func (s suite) watchSkipQuiet(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	st := o.Store
	cs := watch(t, o, st, task.WatchParams{SkipQuiet: true})
	expect := func(what string, version int64) {
		t.Helper()
		ev := next(t, cs, wait)
		if ev.Key != "a" || ev.Task == nil || ev.Task.Version != version {
			t.Fatalf("%s: event %q carrying %+v; want task a at version %d", what, ev.Key, ev.Task, version)
		}
	}
	mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
	expect("insert", 1)
	var holder task.Holder
	mustModify(t, st, "a", func(tk *task.Task) error {
		holder = tk.Claim(task.Holder{TaskKey: "a", WorkerID: "w", Instance: "i"}, st.Now())
		return nil
	})
	expect("claim", 2)
	for range 3 {
		got := mustModify(t, st, "a", func(tk *task.Task) error { return tk.Renew(holder, st.Now()) })
		if !got.Quiet() {
			t.Fatalf("a renewal is not quiet: %+v", got)
		}
	}
	mustModify(t, st, "a", func(tk *task.Task) error { return tk.Succeed(holder, st.Now()) })
	expect("after three renewals and the finish", 6)
}
