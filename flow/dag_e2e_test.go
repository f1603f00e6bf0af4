package flow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

func stepOf(name string, needs ...string) flow.Step {
	return flow.Step{Name: name, Needs: needs, Action: flow.Action{Kind: "test.step"},
		Rollback: &flow.Action{Kind: "test.step"}}
}

// position returns where line is in runs (-1: absent).
func position(runs []string, line string) int { return slices.Index(runs, line) }

// TestDAGOnAWorker: fan-out then fan-in on a real worker: the three
// middle steps overlap, the last starts after all three ended; with one
// failing, the failure's branch and its siblings roll back before the
// root, and the fan-in step never starts.
func TestDAGOnAWorker(t *testing.T) {
	r := newRig(t)
	steps := []flow.Step{stepOf("a"), stepOf("b", "a"), stepOf("c", "a"), stepOf("d", "a"), stepOf("e", "b", "c", "d")}
	r.publish(t, "fan", `{}`, steps)
	f := r.wait(t, "fan")
	runs := r.runs()
	if f.State != flow.StateSucceeded {
		t.Fatalf("flow %s (%s); ran %v", f.State, f.Error, runs)
	}
	for _, mid := range []string{"b", "c", "d"} {
		if position(runs, "start "+mid+" do") < position(runs, "end a do") || position(runs, "start e do") < position(runs, "end "+mid+" do") {
			t.Fatalf("%s ran out of order: %v", mid, runs)
		}
	}
	if !f.Progress[1].Do.StartedAt.Equal(f.Progress[2].Do.StartedAt) {
		t.Errorf("b and c started at %s and %s: want both by a's outcome's write", f.Progress[1].Do.StartedAt, f.Progress[2].Do.StartedAt)
	}
	if string(f.Params["e"]) != `"e"` || len(f.Params) != 5 {
		t.Fatalf("params %v: want each step's result", f.Params)
	}

	steps[2].Payload = json.RawMessage(`"fail"`)
	one := 0
	steps[2].Retries = &one
	r.publish(t, "fan-fail", `{}`, steps)
	f = r.wait(t, "fan-fail")
	if f.State != flow.StateFailed {
		t.Fatalf("flow %s (%s)", f.State, f.Error)
	}
	for _, mid := range []string{"b", "c", "d"} {
		p := f.Progress[slices.IndexFunc(f.Steps, func(s flow.Step) bool { return s.Name == mid })]
		if p.Undo.State != flow.RunSucceeded || p.Undo.EndedAt.After(f.Progress[0].Undo.StartedAt) {
			t.Fatalf("%s's rollback %s ended %s, a's started %s: want before", mid, p.Undo.State, p.Undo.EndedAt, f.Progress[0].Undo.StartedAt)
		}
	}
	if f.Progress[4].State != flow.StepSkipped || f.Progress[4].Do.State != flow.RunNone {
		t.Fatalf("e is %s: want skipped", f.Progress[4].State)
	}
}

// TestSleepStepFiresOnTime: a sleep step's timer task is due at its
// time and the flow moves on within a second of it, no worker slot held
// meanwhile.
func TestSleepStepFiresOnTime(t *testing.T) {
	r := newRig(t)
	until := time.Now().Add(2 * time.Second).UTC().Truncate(time.Millisecond)
	r.publish(t, "nap", `{}`, []flow.Step{
		{Name: "nap", Sleep: task.Duration(time.Second)},
		{Name: "alarm", Until: until},
		stepOf("after", "nap", "alarm"),
	})
	f, err := flow.Get(context.Background(), r.store, "nap")
	if err != nil {
		t.Fatal(err)
	}
	timer, err := r.store.Get(context.Background(), f.Progress[1].Do.Task)
	if err != nil || timer.Kind != flow.TimerKind || !timer.RunAt.Equal(until) {
		t.Fatalf("alarm's timer %+v (%v): want kind %s due %s", timer, err, flow.TimerKind, until)
	}
	f = r.wait(t, "nap")
	if f.State != flow.StateSucceeded {
		t.Fatalf("flow %s (%s)", f.State, f.Error)
	}
	for i, due := range []time.Time{f.Progress[0].Do.StartedAt.Add(time.Second), until} {
		d := f.Progress[i].Do
		if !d.Due.Equal(due) || d.EndedAt.Before(due) || d.EndedAt.Sub(due) > time.Second {
			t.Errorf("%s due %s (want %s) ended %s: want within 1s after", f.Steps[i].Name, d.Due, due, d.EndedAt)
		}
	}
}

// TestTimerFiresWhileEverySlotIsBusy: a sleep step's timer that falls due
// while every slot of the only worker runs a handler that does not end
// still fires within 1 s of its time, beside them.
func TestTimerFiresWhileEverySlotIsBusy(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var busy []string
	for i := range 8 { // the rig's Concurrency
		busy = append(busy, fmt.Sprintf("busy-%d", i))
		if _, _, err := task.Publish(ctx, r.store, task.PublishParams{Key: busy[i], Kind: "test.block"}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, k := range busy {
			task.Cancel(ctx, r.store, k)
		}
	})
	running := func() int {
		n := 0
		for _, k := range busy {
			if tk, err := r.store.Get(ctx, k); err == nil && tk.State == task.StateRunning {
				n++
			}
		}
		return n
	}
	testutil.Eventually(t, 10*time.Second, "every blocking task to run", func() bool { return running() == len(busy) })
	until := time.Now().Add(time.Second).UTC().Truncate(time.Millisecond)
	r.publish(t, "nap", `{}`, []flow.Step{{Name: "alarm", Until: until}})
	var f *flow.Flow
	testutil.Eventually(t, time.Until(until.Add(5*time.Second)), "the alarm to fire, every slot running a blocking task", func() bool {
		var err error
		if f, err = flow.Get(ctx, r.store, "nap"); err != nil {
			t.Fatal(err)
		}
		return f.State == flow.StateSucceeded
	})
	if d := f.Progress[0].Do; !d.Due.Equal(until) || d.EndedAt.Before(until) || d.EndedAt.Sub(until) > time.Second {
		t.Fatalf("alarm due %s (want %s) ended %s: want within 1 s after", d.Due, until, d.EndedAt)
	}
	if n := running(); n != len(busy) {
		t.Fatalf("%d of %d blocking tasks still running when the timer fired: want all (every slot busy)", n, len(busy))
	}
}

// TestSignalOnAWorker: a signal step waits holding nothing; Signal ends
// it with its payload as the result; a second is refused; a timeout takes
// the default, or fails the step and rolls back.
func TestSignalOnAWorker(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	approval := flow.Step{Name: "approval", Type: flow.TypeSignal, Needs: []string{"create"}}
	// The step after the signal waits at the gate until the second signal
	// is sent: the flow must not finish in between, or that signal meets a
	// finished flow (a loaded machine ran the step and ended the flow
	// between two calls).
	gated := flow.Step{Name: "bill", Needs: []string{"approval"}, Action: flow.Action{Kind: "test.gate"}}
	r.publish(t, "sig", `{}`, []flow.Step{stepOf("create"), approval, gated})
	testutil.Eventually(t, 10*time.Second, "approval to wait", func() bool {
		f, err := flow.Get(ctx, r.store, "sig")
		if err != nil {
			t.Fatal(err)
		}
		return f.Progress[1].State == flow.StepRunning
	})
	if _, err := flow.Signal(ctx, r.store, "sig", "approval", json.RawMessage(`{"ok":`)); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("signal with a broken payload: %v", err)
	}
	if _, err := flow.Signal(ctx, r.store, "nope", "approval", nil); !errors.Is(err, flow.ErrNotFound) {
		t.Fatalf("signal to no flow: %v", err)
	}
	if _, err := flow.Signal(ctx, r.store, "sig", "approval", json.RawMessage(`{"by":"ann"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := flow.Signal(ctx, r.store, "sig", "approval", json.RawMessage(`{"by":"bob"}`)); !errors.Is(err, flow.ErrAlreadySignalled) {
		t.Fatalf("second signal: %v", err)
	}
	close(r.gate)
	f := r.wait(t, "sig")
	if f.State != flow.StateSucceeded || string(f.Params["approval"]) != `{"by":"ann"}` {
		t.Fatalf("flow %s, approval %s", f.State, f.Params["approval"])
	}
	if _, err := flow.Signal(ctx, r.store, "sig", "approval", nil); !errors.Is(err, flow.ErrFinished) {
		t.Fatalf("signal to a finished flow: %v", err)
	}

	approval.Timeout = task.Duration(500 * time.Millisecond)
	approval.Default = json.RawMessage(`{"approved":false}`)
	r.publish(t, "sig-default", `{}`, []flow.Step{stepOf("create"), approval, stepOf("bill", "approval")})
	approval.Default = nil
	r.publish(t, "sig-fail", `{}`, []flow.Step{stepOf("create"), approval, stepOf("bill", "approval")})
	if f := r.wait(t, "sig-default"); f.State != flow.StateSucceeded || string(f.Params["approval"]) != `{"approved":false}` {
		t.Fatalf("sig-default %s, approval %s", f.State, f.Params["approval"])
	}
	f = r.wait(t, "sig-fail")
	if f.State != flow.StateFailed || f.Progress[0].Undo.State != flow.RunSucceeded || !strings.Contains(f.Error, "no signal within 500ms") {
		t.Fatalf("sig-fail %s %q, create's rollback %s", f.State, f.Error, f.Progress[0].Undo.State)
	}
	if d := f.Progress[1].Do; d.EndedAt.Sub(d.Due) > time.Second || d.EndedAt.Before(d.Due) {
		t.Fatalf("timeout due %s ended %s: want within 1s", d.Due, d.EndedAt)
	}
}

// TestSkippedStepsSayWhy: on a real worker, a step that never started
// because a step it needs failed is skipped, not failed, and says why,
// whether a max_failed_needs step tolerated the failure or the flow
// rolled back.
func TestSkippedStepsSayWhy(t *testing.T) {
	r := newRig(t)
	zero := 0
	failing := func(st flow.Step) flow.Step {
		st.Payload, st.Retries = json.RawMessage(`"fail"`), &zero
		return st
	}
	r.publish(t, "chain", `{}`, []flow.Step{stepOf("a"), failing(stepOf("b", "a")), stepOf("c", "b"), stepOf("d", "c")})
	all := stepOf("all", "v1", "v2")
	all.MaxFailedNeeds = 1
	r.publish(t, "fleet", `{}`, []flow.Step{failing(stepOf("u1")), stepOf("u2"), stepOf("v1", "u1"), stepOf("v2", "u2"), all})
	for key, want := range map[string]struct {
		state flow.State
		steps string
	}{
		"chain": {flow.StateFailed, "a:rolled_back: b:rolled_back: c:skipped:needs b, which failed d:skipped:needs c, which was skipped"},
		"fleet": {flow.StateSucceeded, "u1:failed: u2:succeeded: v1:skipped:needs u1, which failed v2:succeeded: all:succeeded:"},
	} {
		r.wait(t, key)
		// Read back from the store, as the API and the CLI read it.
		f, err := flow.Get(context.Background(), r.store, key)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, p := range f.Progress {
			got = append(got, f.Steps[i].Name+":"+string(p.State)+":"+p.Reason)
		}
		if f.State != want.state || strings.Join(got, " ") != want.steps {
			t.Errorf("%s: %s, steps\n %s\nwant %s\n %s", key, f.State, strings.Join(got, " "), want.state, want.steps)
		}
	}
}
