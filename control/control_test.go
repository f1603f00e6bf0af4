package control_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func tk(kind string, locks ...string) *task.Task {
	return &task.Task{Key: "k", Kind: kind, LockKeys: locks}
}

func TestPausedMatchesAllKindAndLock(t *testing.T) {
	s := control.NewState([]control.PauseInfo{
		{Target: control.Kind("report")},
		{Target: control.Lock("device:pump-7")},
		{Target: control.Lock("site:berlin/*")},
	}, nil)
	cases := []struct {
		t    *task.Task
		want string // the pause's target, "" for none
	}{
		{tk("report"), "kind:report"},
		{tk("exec"), ""},
		{tk("exec", "device:pump-7"), "lock:device:pump-7"},
		{tk("exec", "device:pump-8"), ""},
		{tk("exec", "device:pump-8", "site:berlin/hall-2"), "lock:site:berlin/*"},
		{tk("exec", "site:bern/x"), ""},
		{nil, ""},
	}
	for _, c := range cases {
		got, paused := s.Paused(c.t)
		if paused != (c.want != "") || (paused && got.String() != c.want) {
			t.Errorf("Paused(%+v) = %s, %v; want %q", c.t, got, paused, c.want)
		}
	}
	all := control.NewState([]control.PauseInfo{{Target: control.All()}}, nil)
	if got, paused := all.Paused(tk("anything")); !paused || got != control.All() {
		t.Errorf("pause all: Paused = %s, %v", got, paused)
	}
	var none *control.State
	if _, paused := none.Paused(tk("x", "device:a")); paused || none.Buckets(tk("x", "device:a")) != nil {
		t.Error("a nil State controls something")
	}
}

func TestBucketsExactBeatsLongestPattern(t *testing.T) {
	s := control.NewState(nil, []control.Limit{
		{Target: control.Lock("device:*"), N: 2, Per: time.Second},
		{Target: control.Lock("device:cam-*"), N: 1, Per: time.Second},
		{Target: control.Lock("device:cam-1"), N: 5, Per: time.Minute},
		{Target: control.Kind("mail"), N: 10, Per: time.Second},
	})
	got := s.Buckets(tk("mail", "device:cam-1", "device:cam-2", "device:pump", "other"))
	want := []control.Bucket{
		{Key: "kind:mail", N: 10, Per: time.Second},
		{Key: "lock:device:cam-1", N: 5, Per: time.Minute},
		{Key: "lock:device:cam-2", N: 1, Per: time.Second},
		{Key: "lock:device:pump", N: 2, Per: time.Second},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Buckets =\n %+v\nwant\n %+v", got, want)
	}
	if k := want[3].SlotKey(1); k != "lock:device:pump#1" {
		t.Errorf("SlotKey = %q", k)
	}
	if b := s.Buckets(tk("exec")); len(b) != 0 {
		t.Errorf("unlimited task has buckets %+v", b)
	}
}

func TestParseRateAndTarget(t *testing.T) {
	for in, want := range map[string]control.Limit{"2/1s": {N: 2, Per: time.Second}, "10/s": {N: 10, Per: time.Second}, "1/250ms": {N: 1, Per: 250 * time.Millisecond}} {
		n, per, err := control.ParseRate(in)
		if err != nil || n != want.N || per != want.Per {
			t.Errorf("ParseRate(%q) = %d, %s, %v", in, n, per, err)
		}
	}
	for _, bad := range []string{"2", "x/1s", "2/", "2/fast", "1.5/1s"} {
		if _, _, err := control.ParseRate(bad); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("ParseRate(%q): %v, want ErrInvalid", bad, err)
		}
	}
	for _, s := range []string{"all", "kind:mail", "lock:device:pump-7", "lock:device:*"} {
		if got, err := control.ParseTarget(s); err != nil || got.String() != s {
			t.Errorf("ParseTarget(%q) = %s, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "kind:", "everything", "queue:x", "all:x"} {
		if _, err := control.ParseTarget(bad); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("ParseTarget(%q): %v, want ErrInvalid", bad, err)
		}
	}
	for _, l := range []control.Limit{{Target: control.All(), N: 1, Per: time.Second}, {Target: control.Kind("a"), N: 0, Per: time.Second}, {Target: control.Kind("a"), N: 1}} {
		if err := l.Validate(); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("Validate(%+v): %v, want ErrInvalid", l, err)
		}
	}
}

// watched opens a fresh store and a change stream on it asking for the
// doorbell; rang fails the test unless the stream's next event is the
// doorbell's.
func watched(t *testing.T) (st *sqlitestore.Store, rang func(what string)) {
	t.Helper()
	ctx := t.Context()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "s.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	stream, err := st.Watch(ctx, task.WatchParams{Documents: []string{control.DoorbellNamespace}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	return st, func(what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ev, err := stream.Next(wctx)
		if err != nil || ev.Document == nil || ev.Document.Namespace != control.DoorbellNamespace || ev.Document.ID != control.DoorbellID {
			t.Fatalf("%s: next event %+v, %v; want the doorbell", what, ev, err)
		}
	}
}

// TestStoredPausesRingTheDoorbell pauses and resumes through the Go API on
// a real store: every write shows up as an event of the doorbell document,
// which is no task (a stream of task writes never sees it), and is
// written again after someone deleted it.
func TestStoredPausesRingTheDoorbell(t *testing.T) {
	ctx := t.Context()
	st, rang := watched(t)
	if changed, err := control.Pause(ctx, st, control.Lock("device:pump-7")); err != nil || !changed {
		t.Fatalf("Pause = %v, %v", changed, err)
	}
	rang("pause")
	if changed, err := control.Pause(ctx, st, control.Lock("device:pump-7")); err != nil || changed {
		t.Fatalf("second Pause = %v, %v; want no change", changed, err)
	}
	if _, err := control.Pause(ctx, st, control.All()); err != nil {
		t.Fatal(err)
	}
	rang("pause all")
	ps, err := control.Pauses(ctx, st)
	if err != nil || len(ps) != 2 || ps[0].Target != control.All() || ps[1].Target != control.Lock("device:pump-7") || ps[1].Since.IsZero() {
		t.Fatalf("Pauses = %+v, %v", ps, err)
	}
	if changed, err := control.Resume(ctx, st, control.All()); err != nil || !changed {
		t.Fatalf("Resume = %v, %v", changed, err)
	}
	rang("resume")
	if ps, _ := control.Pauses(ctx, st); len(ps) != 1 {
		t.Fatalf("after resume, Pauses = %+v", ps)
	}

	doc, err := st.GetDocument(ctx, control.DoorbellNamespace, control.DoorbellID)
	if err != nil || doc.Version != 3 {
		t.Fatalf("doorbell = %+v, %v; want version 3 after three control writes", doc, err)
	}
	if ts, err := st.List(ctx, task.ListQuery{Reserved: true, Limit: 10}); err != nil || len(ts) != 0 {
		t.Fatalf("tasks after control writes: %d, %v; want none", len(ts), err)
	}
	if err := st.DeleteDocument(ctx, control.DoorbellNamespace, control.DoorbellID, 0); err != nil {
		t.Fatal(err)
	}
	rang("delete")
	if err := control.Ring(ctx, st); err != nil {
		t.Fatal(err)
	}
	rang("ring after delete")
	if doc, err := st.GetDocument(ctx, control.DoorbellNamespace, control.DoorbellID); err != nil || doc.Version != 1 {
		t.Fatalf("doorbell after a ring over a deleted one: %+v, %v; want version 1", doc, err)
	}
}

// TestTaskStreamsDoNotHearTheDoorbell: a stream opened for task writes
// only sees no control write.
func TestTaskStreamsDoNotHearTheDoorbell(t *testing.T) {
	ctx := t.Context()
	st, rang := watched(t)
	tasks, err := st.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer tasks.Close()
	if _, err := control.Pause(ctx, st, control.All()); err != nil {
		t.Fatal(err)
	}
	rang("pause")
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "after", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ev, err := tasks.Next(wctx); err != nil || ev.Key != "after" || ev.Document != nil {
		t.Fatalf("task stream's first event %+v, %v; want task after", ev, err)
	}
}

// TestConcurrentRingsAllLand: control writes racing on the doorbell each
// ring it or yield to one that rang after them; none fails.
func TestConcurrentRingsAllLand(t *testing.T) {
	ctx := t.Context()
	st, _ := watched(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = control.Ring(ctx, st) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("ring %d: %v", i, err)
		}
	}
	if doc, err := st.GetDocument(ctx, control.DoorbellNamespace, control.DoorbellID); err != nil || doc.Version < 1 {
		t.Fatalf("doorbell after concurrent rings: %+v, %v", doc, err)
	}
}

// TestStoredLimitsRingTheDoorbell sets, replaces and removes a limit
// through the Go API; each write rings the doorbell.
func TestStoredLimitsRingTheDoorbell(t *testing.T) {
	ctx := t.Context()
	st, rang := watched(t)
	l := control.Limit{Target: control.Lock("device:*"), N: 2, Per: time.Second}
	if err := control.SetLimit(ctx, st, l); err != nil {
		t.Fatal(err)
	}
	rang("limit")
	l.N = 3
	if err := control.SetLimit(ctx, st, l); err != nil {
		t.Fatal(err)
	}
	rang("limit replaced")
	if ls, err := control.Limits(ctx, st); err != nil || len(ls) != 1 || ls[0] != l {
		t.Fatalf("Limits = %+v, %v; want [%+v]", ls, err, l)
	}
	if removed, err := control.RemoveLimit(ctx, st, l.Target); err != nil || !removed {
		t.Fatalf("RemoveLimit = %v, %v", removed, err)
	}
	rang("limit removed")
	if removed, err := control.RemoveLimit(ctx, st, l.Target); err != nil || removed {
		t.Fatalf("second RemoveLimit = %v, %v; want nothing removed", removed, err)
	}
	if ls, _ := control.Limits(ctx, st); len(ls) != 0 {
		t.Fatalf("after remove, Limits = %+v", ls)
	}
}

// TestConcurrentPausesChangeOnce: writers racing to pause one target
// compare-and-set its document, so exactly one reports the change; the
// resume deletes the document, and a value marked off (as an upgraded
// store may hold) reads as not paused.
func TestConcurrentPausesChangeOnce(t *testing.T) {
	ctx := t.Context()
	st, _ := watched(t)
	var wg sync.WaitGroup
	changed := make([]bool, 8)
	errs := make([]error, len(changed))
	for i := range changed {
		wg.Go(func() { changed[i], errs[i] = control.Pause(ctx, st, control.Kind("k")) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := len(slices.DeleteFunc(changed, func(c bool) bool { return !c })); n != 1 {
		t.Fatalf("%d concurrent pauses reported the change; want exactly 1", n)
	}
	if _, err := control.Resume(ctx, st, control.Kind("k")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetDocument(ctx, control.PauseNamespace, "kind:k"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("pause document after resume: %v; want ErrNotFound", err)
	}
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: control.PauseNamespace, ID: "kind:off", Value: []byte(`{"paused":false}`)}); err != nil {
		t.Fatal(err)
	}
	if ps, err := control.Pauses(ctx, st); err != nil || len(ps) != 0 {
		t.Fatalf("Pauses with one marked off = %+v, %v; want none", ps, err)
	}
	if changed, err := control.Pause(ctx, st, control.Kind("off")); err != nil || !changed {
		t.Fatalf("Pause over one marked off = %v, %v; want changed", changed, err)
	}
}
