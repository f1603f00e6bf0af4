package events_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
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

// lifecycle drives tasks through every kind of write on s, calling step
// after each write with the event lines that write should yield.
func lifecycle(t *testing.T, s task.Store, step func(want ...string)) {
	t.Helper()
	ctx := context.Background()
	var h task.Holder
	do := func(key string, fn func(tk *task.Task) error, want ...string) {
		t.Helper()
		if _, err := task.Modify(ctx, s, key, fn); err != nil {
			t.Fatal(err)
		}
		step(want...)
	}
	claim := func(worker string) func(tk *task.Task) error {
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
		step("published " + key)
	}
	// a: publish → claim → fail → retry-claim → (renewal) → succeed.
	publish("a", 0)
	do("a", claim("w1"), "claimed a w1#1")
	do("a", func(tk *task.Task) error { return tk.Fail(h, "boom", time.Time{}, s.Now()) }, "failed a w1#1 boom", "retried a w1#1")
	do("a", claim("w2"), "claimed a w2#2")
	do("a", func(tk *task.Task) error { return tk.Renew(h, s.Now()) })
	do("a", func(tk *task.Task) error { return tk.Succeed(h, s.Now()) }, "succeeded a w2#2")
	// b: snoozed, then cancelled, then retried by an operator.
	publish("b", 0)
	do("b", claim("w1"), "claimed b w1#1")
	do("b", func(tk *task.Task) error { return tk.Snooze(h, s.Now().Add(time.Hour), s.Now()) }, "snoozed b w1#1")
	do("b", func(tk *task.Task) error { return tk.Cancel(s.Now()) }, "cancelled b")
	do("b", func(tk *task.Task) error { return tk.Reset(s.Now()) }, "reset b")
	// c: w1's lease runs out and w2 takes over; then released.
	publish("c", 100*time.Millisecond)
	do("c", claim("w1"), "claimed c w1#1")
	testutil.Eventually(t, 5*time.Second, "c's lease to run out in store time", func() bool {
		tk, err := s.Get(ctx, "c")
		return err == nil && s.Now().After(tk.Attempts[len(tk.Attempts)-1].LeaseUntil)
	})
	do("c", claim("w2"), "expired c w1#1 by w2 lease expired", "claimed c w2#2")
	do("c", func(tk *task.Task) error { return tk.Release(h, s.Now()) }, "released c w2#2")
}

// openMongo opens a store on a database of its own, named db and a time,
// on the shared test server; it is dropped and closed when t ends.
func openMongo(t *testing.T, db string) *mongostore.Store {
	t.Helper()
	cfg := mongostore.Config{Database: fmt.Sprintf("%s_%d", db, time.Now().UnixNano())}
	s, err := mongostore.Open(context.Background(), testservers.MongoURI(t), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Database().Drop(ctx)
		_ = s.Close()
	})
	return s
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
	var want []string
	lifecycle(t, w, func(lines ...string) { want = append(want, lines...) })
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

// On MongoDB a change event carries the document looked up when it is
// read: a follower that keeps up (reads each write's events before the
// next write) gets them exactly; one that reads the same writes later gets
// each event at most once, in order.
func TestFollowMongo(t *testing.T) {
	s := openMongo(t, "lp_events")
	live := follow(t, s, events.Params{})
	var want []string
	var first string
	lifecycle(t, s, func(ls ...string) {
		t.Helper()
		want = append(want, ls...)
		evs := read(t, live, len(ls))
		if g := lines(evs); !reflect.DeepEqual(g, ls) {
			t.Fatalf("live: got %q, want %q", g, ls)
		}
		if first == "" && len(evs) > 0 {
			first = evs[0].Token
		}
	})
	quiet(t, live)

	behind := follow(t, s, events.Params{After: first})
	var got []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		e, err := behind.Next(ctx)
		cancel()
		if err != nil {
			break
		}
		got = append(got, line(e))
	}
	// Each write yields its events only if the document looked up is its
	// own: the last write of each task always is.
	rest := want[1:]
	for _, g := range got {
		i := slices.Index(rest, g)
		if i < 0 {
			t.Fatalf("behind: %q repeated, invented or out of order in %q (want a subsequence of %q)", g, got, want[1:])
		}
		rest = rest[i+1:]
	}
	for _, final := range []string{"succeeded a w2#2", "reset b", "released c w2#2"} {
		if !slices.Contains(got, final) {
			t.Errorf("behind: %q missing from %q", final, got)
		}
	}
}

// A token older than the store's history fails Follow with ErrHistoryLost,
// wrapped, so the caller can tell it and start from now.
func TestFollowHistoryLost(t *testing.T) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), &sqlitestore.Config{Retention: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	st := follow(t, s, events.Params{})
	for i := range 40 {
		if _, _, err := task.Publish(context.Background(), s, task.PublishParams{Key: fmt.Sprint("k", i), Kind: "job"}); err != nil {
			t.Fatal(err)
		}
	}
	// The stream opened before fell behind the pruning: Next says so.
	if _, err := st.Next(context.Background()); !errors.Is(err, task.ErrHistoryLost) {
		t.Errorf("Next behind the history: %v, want ErrHistoryLost", err)
	}
	// "MA" is change 0 of the embedded store: long pruned.
	if _, err = events.Follow(context.Background(), s, events.Params{After: "MA"}); !errors.Is(err, task.ErrHistoryLost) {
		t.Errorf("Follow from a pruned token: %v, want ErrHistoryLost", err)
	}
}
