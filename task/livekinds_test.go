package task_test

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestKindsWithoutWorker(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "x.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := s.Now()
	register := func(id string, until time.Time, kinds ...string) {
		t.Helper()
		w := task.WorkerInfo{ID: id, Instance: id + "-i", Kinds: kinds, Heartbeat: now, Until: until}
		if err := s.RegisterWorker(ctx, task.RegisterParams{Worker: w, Now: now}); err != nil {
			t.Fatal(err)
		}
	}

	got, err := task.KindsWithoutWorker(ctx, s, now, "resize", "noop")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`no live worker runs kind "resize" (live: none); the task waits until one does`,
		`no live worker runs kind "noop" (live: none); the task waits until one does`,
	}
	if texts := warnings(got); !slices.Equal(texts, want) {
		t.Errorf("empty registry:\n got %q\nwant %q", texts, want)
	}

	register("w1", now.Add(time.Minute), "noop", "exec")
	register("w2", now.Add(time.Minute), "resize", "noop")
	register("gone", now.Add(-time.Second), "thumbnail") // lapsed: runs nothing
	got, err = task.KindsWithoutWorker(ctx, s, now, "resze", "noop", "resize", "thumbnail", "resze")
	if err != nil {
		t.Fatal(err)
	}
	want = []string{
		`no live worker runs kind "resze" (live: exec, noop, resize); the task waits until one does`,
		`no live worker runs kind "thumbnail" (live: exec, noop, resize); the task waits until one does`,
	}
	if texts := warnings(got); !slices.Equal(texts, want) {
		t.Errorf("live workers:\n got %q\nwant %q", texts, want)
	}

	// A live worker that registered no kinds claims every kind.
	register("any", now.Add(time.Minute))
	if got, err = task.KindsWithoutWorker(ctx, s, now, "resze"); err != nil || len(got) != 0 {
		t.Errorf("with a worker of every kind: %v, %v; want none", got, err)
	}
}

func warnings(ns []task.NoWorker) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Warning())
	}
	return out
}

func TestNoWorkerRefusal(t *testing.T) {
	t.Parallel()
	err := task.NoWorker{Kind: "resze", Live: []string{"noop"}}.Refusal("kind")
	want := `invalid: kind: no live worker runs kind "resze" (live: noop); a strict publish refuses it`
	if !errors.Is(err, task.ErrInvalid) || err.Error() != want {
		t.Errorf("Refusal = %v, want %q wrapping ErrInvalid", err, want)
	}
}
