package rollout

import (
	"context"
	"testing"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// A rollout keeps its creation's trace context and publishes its device
// tasks as children of it, whoever steps it. (Tracing is off in this
// process: what is kept is the caller's context itself.)
func TestRolloutTasksContinueItsTrace(t *testing.T) {
	st := openStore(t)
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := tracing.Extract(context.Background(), parent, "vendor=r")
	r, err := Create(ctx, st, "fw-traced", Spec{Command: "update", Devices: devices(3)})
	if err != nil {
		t.Fatal(err)
	}
	want := task.Trace{Traceparent: parent, Tracestate: "vendor=r"}
	if got, err := Get(context.Background(), st, "fw-traced"); err != nil || got.Trace != want {
		t.Fatalf("stored rollout trace %+v (%v); want %+v", got.Trace, err, want)
	}
	if _, err := Create(context.Background(), st, "fw-plain", Spec{Command: "update", Devices: devices(1)}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	for _, name := range []string{"fw-traced", "fw-plain"} {
		if err := s.Step(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range r.Devices {
		tk, err := st.Get(context.Background(), TaskKey(r.Name, d.Device, 1))
		if err != nil {
			t.Fatalf("device task of %s: %v", d.Device, err)
		}
		if tk.Trace != want {
			t.Errorf("device task %s has trace %+v; want the rollout's %+v", tk.Key, tk.Trace, want)
		}
	}
	plain, err := st.Get(context.Background(), TaskKey("fw-plain", devices(1)[0], 1))
	if err != nil {
		t.Fatal(err)
	}
	if !plain.Trace.IsZero() {
		t.Errorf("a rollout created without a trace context gave its task %+v", plain.Trace)
	}
}
