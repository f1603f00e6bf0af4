package events_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// line is what the sequence tests compare of an event.
func line(e events.Event) string {
	s := fmt.Sprintf("%s %s", e.Type, e.Key)
	if e.Worker != "" {
		s += fmt.Sprintf(" %s#%d", e.Worker, e.Attempt)
	}
	if e.By != "" {
		s += " by " + e.By
	}
	if e.Error != "" {
		s += " " + e.Error
	}
	return s
}

// lifecycle drives tasks through every kind of write on s and returns the
// event lines expected, in order.
func lifecycle(t *testing.T, s task.Store) []string {
	t.Helper()
	ctx := context.Background()
	must := func(_ *task.Task, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var h task.Holder
	claim := func(key, worker string) func(tk *task.Task) error {
		return func(tk *task.Task) error {
			h = tk.Claim(task.Holder{WorkerID: worker, Instance: worker}, s.Now())
			return nil
		}
	}
	publish := func(key string, timeout time.Duration) {
		t.Helper()
		_, _, err := task.Publish(ctx, s, task.PublishParams{Key: key, Kind: "job", Options: task.Options{WorkerTimeout: timeout}})
		if err != nil {
			t.Fatal(err)
		}
	}
	// a: publish → claim → fail → retry-claim → (renewal) → succeed.
	publish("a", 0)
	must(task.Modify(ctx, s, "a", claim("a", "w1")))
	must(task.Modify(ctx, s, "a", func(tk *task.Task) error { return tk.Fail(h, "boom", time.Time{}, s.Now()) }))
	must(task.Modify(ctx, s, "a", claim("a", "w2")))
	must(task.Modify(ctx, s, "a", func(tk *task.Task) error { return tk.Renew(h, s.Now()) }))
	must(task.Modify(ctx, s, "a", func(tk *task.Task) error { return tk.Succeed(h, s.Now()) }))
	// b: snoozed, then cancelled, then retried by an operator.
	publish("b", 0)
	must(task.Modify(ctx, s, "b", claim("b", "w1")))
	must(task.Modify(ctx, s, "b", func(tk *task.Task) error { return tk.Snooze(h, s.Now().Add(time.Hour), s.Now()) }))
	must(task.Cancel(ctx, s, "b"))
	must(task.Retry(ctx, s, "b"))
	// c: w1's lease runs out and w2 takes over; then released.
	publish("c", 100*time.Millisecond)
	must(task.Modify(ctx, s, "c", claim("c", "w1")))
	time.Sleep(150 * time.Millisecond)
	must(task.Modify(ctx, s, "c", claim("c", "w2")))
	must(task.Modify(ctx, s, "c", func(tk *task.Task) error { return tk.Release(h, s.Now()) }))
	return []string{
		"published a", "claimed a w1#1", "failed a w1#1 boom", "retried a w1#1", "claimed a w2#2", "succeeded a w2#2",
		"published b", "claimed b w1#1", "snoozed b w1#1", "cancelled b", "reset b",
		"published c", "claimed c w1#1", "expired c w1#1 by w2 lease expired", "claimed c w2#2", "released c w2#2",
	}
}

func openSQLite(t *testing.T, path string) task.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// read takes n events from st.
func read(t *testing.T, st *events.Stream, n int) []events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []events.Event
	for len(out) < n {
		e, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("after %d events %q: %v", len(out), lines(out), err)
		}
		out = append(out, e)
	}
	return out
}

func follow(t *testing.T, s task.Store, p events.Params) *events.Stream {
	t.Helper()
	st, err := events.Follow(context.Background(), s, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func lines(evs []events.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, line(e))
	}
	return out
}

// quiet asserts that st has nothing more: no event repeated or invented.
func quiet(t *testing.T, st *events.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if e, err := st.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("extra event %s (%v)", line(e), err)
	}
}

// checkSequenceAndResume runs the lifecycle on s and checks the exact
// sequence, then that every cut-and-resume reads the same events once.
// The writes go to w and are read from s.
func checkSequenceAndResume(t *testing.T, w, s task.Store) {
	full := follow(t, s, events.Params{})
	start := full.Token()
	want := lifecycle(t, w)
	all := read(t, full, len(want))
	if g := lines(all); !reflect.DeepEqual(g, want) {
		t.Fatalf("events\n got %q\nwant %q", g, want)
	}
	quiet(t, full)
	if full.Token() != all[len(all)-1].Token {
		t.Errorf("Token() %q, want the last event's %q", full.Token(), all[len(all)-1].Token)
	}
	for cut := 1; cut < len(all); cut++ {
		first := follow(t, s, events.Params{After: start})
		head := read(t, first, cut)
		_ = first.Close()
		rest := follow(t, s, events.Params{After: first.Token()})
		tail := read(t, rest, len(all)-cut)
		if g := append(head, tail...); !reflect.DeepEqual(g, all) {
			t.Fatalf("cut after %d: got %q, want %q", cut, lines(g), lines(all))
		}
		quiet(t, rest)
	}
	// Filters: one task's events, of some types only.
	st := follow(t, s, events.Params{After: start, Key: "c", Types: []string{events.Claimed}})
	if g := lines(read(t, st, 2)); !reflect.DeepEqual(g, []string{"claimed c w1#1", "claimed c w2#2"}) {
		t.Errorf("filtered: %q", g)
	}
	quiet(t, st)
	if st := follow(t, s, events.Params{After: start, Kinds: []string{"other"}}); true {
		quiet(t, st)
	}
}

func TestSequenceAndResumeSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	s := openSQLite(t, path)
	t.Run("one store", func(t *testing.T) { checkSequenceAndResume(t, s, s) })
	// Another store on the file, as another process: it reads each change's
	// own document from the file, not its writer's memory.
	path = filepath.Join(t.TempDir(), "store.db")
	t.Run("two stores", func(t *testing.T) { checkSequenceAndResume(t, openSQLite(t, path), openSQLite(t, path)) })
}

func TestFollowBadToken(t *testing.T) {
	s := openSQLite(t, filepath.Join(t.TempDir(), "store.db"))
	for _, tok := range []string{"!!", "MQ.x", "MQ.0", "."} {
		if _, err := events.Follow(context.Background(), s, events.Params{After: tok}); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("token %q: %v, want ErrInvalid", tok, err)
		}
	}
}
