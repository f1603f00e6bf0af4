// registry.go checks the state workers share through the store: the
// worker registry and the records.

package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// registry checks the worker registry: one live process per worker id.
func (s suite) registry(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	info := func(id, instance string, until time.Time) task.WorkerInfo {
		return task.WorkerInfo{ID: id, Instance: instance, Host: "h1", PID: 42, StartedAt: now, Kinds: []string{"noop"},
			Concurrency: 8, Running: 1, Heartbeat: now, Until: until}
	}
	register := func(w task.WorkerInfo, at time.Time, replace string) error {
		return st.RegisterWorker(ctx, task.RegisterParams{Worker: w, Now: at, Replace: replace})
	}
	a := info("dup", "i1", now.Add(4*time.Second))
	if err := register(a, now, ""); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	var taken *task.WorkerIDTakenError
	err := register(info("dup", "i2", now.Add(4*time.Second)), now.Add(time.Second), "")
	if !errors.As(err, &taken) || !errors.Is(err, task.ErrWorkerIDTaken) {
		t.Fatalf("second live process under the same id: %v; want a *task.WorkerIDTakenError", err)
	}
	if h := taken.Holder; h.Instance != "i1" || h.Host != "h1" || h.PID != 42 || !h.Until.Equal(a.Until) {
		t.Fatalf("taken error names %+v; want the first process", h)
	}
	for _, want := range []string{`"dup"`, "h1", "42"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	// The holder renews; others register under other ids.
	a.Running, a.Until = 3, now.Add(6*time.Second)
	if err := register(a, now.Add(2*time.Second), ""); err != nil {
		t.Fatalf("holder renews: %v", err)
	}
	if err := register(info("other", "i9", now.Add(time.Second)), now, ""); err != nil {
		t.Fatalf("another id: %v", err)
	}
	ws, err := st.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "dup" || ws[0].Running != 3 || ws[0].Instance != "i1" || !ws[0].Until.Equal(a.Until) ||
		ws[0].Host != "h1" || ws[0].PID != 42 || ws[0].Concurrency != 8 || len(ws[0].Kinds) != 1 || ws[1].ID != "other" {
		t.Fatalf("Workers = %+v", ws)
	}
	// Once the holder's registration lapses, another process takes the id.
	if err := register(info("dup", "i2", now.Add(10*time.Second)), a.Until, ""); err != nil {
		t.Fatalf("register after the holder lapsed: %v", err)
	}
	// Replace takes over a live registration held by a known-dead instance.
	if err := register(info("dup", "i3", now.Add(10*time.Second)), now, "i2"); err != nil {
		t.Fatalf("replace a dead instance: %v", err)
	}
	// Unregister by a stale instance does nothing; by the holder, frees.
	if err := st.UnregisterWorker(ctx, "dup", "i1"); err != nil {
		t.Fatal(err)
	}
	if err := register(info("dup", "i4", now.Add(10*time.Second)), now, ""); !errors.Is(err, task.ErrWorkerIDTaken) {
		t.Fatalf("stale unregister freed the id: %v", err)
	}
	if err := st.UnregisterWorker(ctx, "dup", "i3"); err != nil {
		t.Fatal(err)
	}
	if err := register(info("dup", "i4", now.Add(10*time.Second)), now, ""); err != nil {
		t.Fatalf("register after the holder unregistered: %v", err)
	}
	if err := register(info("", "i5", now.Add(time.Second)), now, ""); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("empty id: %v; want task.ErrInvalid", err)
	}
}
