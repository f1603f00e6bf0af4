package schedule_test

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// TestConcurrentAddsStoreOne: adds of one name racing without replace
// compare-and-set the same document, so exactly one stores it and the
// others get ErrExists; replace keeps the first CreatedAt, and a removed
// schedule is gone with its cursor.
func TestConcurrentAddsStoreOne(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := t.Context()
	sch := schedule.Schedule{Name: "tick", Every: task.Duration(time.Hour), CatchUp: schedule.DefaultCatchUp, Template: schedule.Template{Kind: "noop"}}
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = schedule.Add(ctx, s, sch, false) })
	}
	wg.Wait()
	added := 0
	for _, err := range errs {
		switch {
		case err == nil:
			added++
		case !errors.Is(err, schedule.ErrExists):
			t.Fatalf("concurrent Add: %v; want nil or ErrExists", err)
		}
	}
	if added != 1 {
		t.Fatalf("%d concurrent adds stored the schedule; want exactly 1", added)
	}
	first, err := schedule.Get(ctx, s, "tick")
	if err != nil {
		t.Fatal(err)
	}
	sch.Every = task.Duration(2 * time.Hour)
	replaced, err := schedule.Add(ctx, s, sch, true)
	if err != nil || !replaced.CreatedAt.Equal(first.CreatedAt) || replaced.Every != sch.Every {
		t.Fatalf("Add with replace = %+v, %v; want every 2h, created at %s", replaced, err, first.CreatedAt)
	}
	if _, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: schedule.CursorNamespace, ID: "tick", Value: []byte(`{"slot":"2026-01-01T00:00:00Z"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := schedule.Remove(ctx, s, "tick"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetDocument(ctx, schedule.CursorNamespace, "tick"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("cursor after Remove: %v; want ErrNotFound", err)
	}
	for _, name := range []string{"tick", ""} {
		if err := schedule.Remove(ctx, s, name); !errors.Is(err, schedule.ErrNotFound) {
			t.Errorf("Remove(%q) of no schedule: %v; want ErrNotFound", name, err)
		}
		if _, err := schedule.Pause(ctx, s, name); !errors.Is(err, schedule.ErrNotFound) {
			t.Errorf("Pause(%q) of no schedule: %v; want ErrNotFound", name, err)
		}
	}
}
