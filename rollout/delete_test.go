package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// unchanged fails the test when the stored document of rollout name is
// not before, byte for byte and version.
func unchanged(t *testing.T, st task.Store, name string, before task.Document) {
	t.Helper()
	after, err := st.GetDocument(context.Background(), Namespace, name)
	if err != nil || after.Version != before.Version || !bytes.Equal(after.Value, before.Value) {
		t.Fatalf("rollout %s changed: version %d -> %d (%v)", name, before.Version, after.Version, err)
	}
}

// Delete takes only a rollout that is over; one still running or
// cancelling is refused, naming what to do, and left as it was; its
// tasks stay.
func TestDeleteTakesOnlyARolloutThatIsOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	newFleet(t, st, 1, nil, nil, 200*time.Millisecond)
	if _, err := Create(ctx, st, "del", Spec{Command: "update", Devices: devices(4), Rate: Rate{N: 1, Per: task.Duration(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	stepUntil(t, s, "del", "a dispatch", func(r *Rollout) bool { return r.Progress().Total.Running == 1 })
	for _, state := range []State{StateRunning, StateCancelling} {
		before, err := st.GetDocument(ctx, Namespace, "del")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Delete(ctx, st, "del")
		if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), string(state)) {
			t.Fatalf("delete of a %s rollout: %v, want ErrState naming the state", state, err)
		}
		unchanged(t, st, "del", before)
		if _, err := Cancel(ctx, st, "del"); err != nil {
			t.Fatal(err)
		}
	}
	r := drive(t, s, "del", 30*time.Second)
	if r.State != StateCancelled {
		t.Fatalf("state %s", r.State)
	}
	// Cancel of a rollout over changes nothing.
	before, _ := st.GetDocument(ctx, Namespace, "del")
	if got, err := Cancel(ctx, st, "del"); err != nil || got.State != StateCancelled {
		t.Fatalf("cancel of a cancelled rollout: %v", err)
	}
	unchanged(t, st, "del", before)
	gone, err := Delete(ctx, st, "del")
	if err != nil || gone.State != StateCancelled {
		t.Fatalf("delete: %+v %v", gone, err)
	}
	if _, err := Get(ctx, st, "del"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := Delete(ctx, st, "del"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
	if tk, err := st.Get(ctx, TaskKey("del", "dev-000", 1)); err != nil || !tk.State.Finished() {
		t.Fatalf("dev-000's task after delete: %+v %v, want it kept, finished", tk, err)
	}
	if list, err := List(ctx, st); err != nil || len(list) != 0 {
		t.Fatalf("list after delete: %d %v", len(list), err)
	}
}

// A rollout with the largest args accepted, all '<>&', runs to the end
// with each device sent exactly those args, and is deleted; another
// like it is cancelled midway and deleted.
func TestLargestHTMLArgsCompleteCancelAndDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	newFleet(t, st, 2, nil, nil, 20*time.Millisecond)
	args := htmlArgs(MaxArgsLen)
	spec := Spec{Command: "update", Args: args, Devices: devices(6), RollbackCommand: "rollback", RollbackArgs: args,
		Rate: Rate{N: 2, Per: task.Duration(100 * time.Millisecond)}}
	for _, name := range []string{"full", "halt"} {
		if _, err := Create(ctx, st, name, spec); err != nil {
			t.Fatal(err)
		}
	}
	s := NewStepper(st)
	done := drive(t, s, "full", time.Minute)
	if done.State != StateCompleted || done.Progress().Total.Succeeded != 6 {
		t.Fatalf("full: %s %+v", done.State, done.Progress().Total)
	}
	tk, err := st.Get(ctx, TaskKey("full", "dev-004", 1))
	if err != nil {
		t.Fatal(err)
	}
	c, err := mqttdev.DecodePayload(tk.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var sent, want any
	if json.Unmarshal(c.Args, &sent) != nil || json.Unmarshal(args, &want) != nil || !reflect.DeepEqual(sent, want) {
		t.Fatalf("dev-004 was sent other args: %.80s", c.Args)
	}

	stepUntil(t, s, "halt", "a dispatch", func(r *Rollout) bool { return r.Progress().Total.Running > 0 })
	if _, err := Cancel(ctx, st, "halt"); err != nil {
		t.Fatal(err)
	}
	halted := drive(t, s, "halt", time.Minute)
	if halted.State != StateCancelled || halted.Progress().Total.Cancelled == 0 {
		t.Fatalf("halt: %s %+v", halted.State, halted.Progress().Total)
	}
	for _, name := range []string{"full", "halt"} {
		if _, err := Delete(ctx, st, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	if list, err := List(ctx, st); err != nil || len(list) != 0 {
		t.Fatalf("left %d rollouts (%v)", len(list), err)
	}
}
