package main

// The demo's flows: a few orders of three sleep steps with rollbacks, one
// failing at its second step, so its rollbacks run in reverse while a
// worker is killed; and, with devices, a few device sequences (flows of
// device commands, each step holding its device's lock) that share
// devices.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// demoFlowCount is how many flows the demo publishes; demoFailingFlow is
// the one that fails at "charge".
const (
	demoFlowCount   = 4
	demoFailingFlow = "order-3"
)

// demoFlowPriority puts the flows' steps ahead of the plain tasks (priority
// 0-6): a flow is the demo's longest chain (three steps one after another,
// a retry, rollbacks, and the rollback of a failed step waits out that
// step's last lease), so behind a few hundred plain tasks it would end
// seconds after them.
const demoFlowPriority = 10

func demoFlowSpecs() []flow.Spec {
	sleep := func(d time.Duration, fail bool) flow.Action {
		b, _ := json.Marshal(map[string]any{"duration": d.String(), "fail": fail})
		one, many := 1, 10
		if fail {
			return flow.Action{Kind: "sleep", Payload: b, Retries: &one, Priority: demoFlowPriority}
		}
		return flow.Action{Kind: "sleep", Payload: b, Retries: &many, Priority: demoFlowPriority}
	}
	var out []flow.Spec
	for i := 1; i <= demoFlowCount; i++ {
		key := fmt.Sprintf("order-%d", i)
		undo := sleep(50*time.Millisecond, false)
		out = append(out, flow.Spec{Key: key, Params: json.RawMessage(fmt.Sprintf(`{"order":%d}`, i)), Steps: []flow.Step{
			{Name: "reserve", Action: sleep(400*time.Millisecond, false), Rollback: &undo},
			{Name: "charge", Action: sleep(400*time.Millisecond, key == demoFailingFlow), Rollback: &undo},
			{Name: "ship", Action: sleep(400*time.Millisecond, false), Rollback: &undo},
		}})
	}
	return out
}

// demoSequenceCount is how many device sequences run when the demo has
// devices: each opens, starts and reads three of the first three reliable
// devices, in a rotated order, so they wait for one another's devices.
const demoSequenceCount = 3

func demoSequenceSpecs() ([]flow.Spec, error) {
	var out []flow.Spec
	for i := range demoSequenceCount {
		spec := flow.Spec{Key: fmt.Sprintf("sequence-%d", i+1)}
		for j, command := range []string{"open", "start", "read"} {
			dev := fmt.Sprintf("dev-%d", (i+j)%3)
			p, err := mqttdev.PublishParams("x", mqttdev.Command{Device: dev, Command: command,
				AckTimeout: task.Duration(500 * time.Millisecond), ResultTimeout: task.Duration(3 * time.Second)}, task.Options{})
			if err != nil {
				return nil, err
			}
			many := 10
			spec.Steps = append(spec.Steps, flow.Step{Name: command + "-" + dev,
				Action: flow.Action{Kind: p.Kind, Payload: p.Payload, LockKeys: p.LockKeys, Retries: &many}})
		}
		out = append(out, spec)
	}
	return out, nil
}

func publishDemoFlows(ctx context.Context, w io.Writer, s task.Store, devices bool) error {
	specs := demoFlowSpecs()
	if devices {
		seqs, err := demoSequenceSpecs()
		if err != nil {
			return err
		}
		specs = append(specs, seqs...)
	}
	for _, spec := range specs {
		if _, _, err := flow.Publish(ctx, s, spec); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "published %d flows (reserve, charge, ship; %s fails at charge and rolls back)\n", demoFlowCount, demoFailingFlow)
	if devices {
		fmt.Fprintf(w, "published %d device sequences (open, start, read on dev-0..dev-2, overlapping)\n", demoSequenceCount)
	}
	return nil
}

// demoFlows are the flows the demo publishes (device sequences with
// devices).
func demoFlows(devices bool) ([]flow.Spec, error) {
	specs := demoFlowSpecs()
	if devices {
		seqs, err := demoSequenceSpecs()
		if err != nil {
			return nil, err
		}
		specs = append(specs, seqs...)
	}
	return specs, nil
}

// demoFlowsEnded reports whether every demo flow has finished: a flow
// moves on after its step's task ends (the step's record, the next step's
// publish, a reconciler pass after a killed worker's), so every task
// finished does not mean every flow has.
func demoFlowsEnded(ctx context.Context, s task.Store, devices bool) (bool, error) {
	specs, err := demoFlows(devices)
	if err != nil {
		return false, err
	}
	for _, spec := range specs {
		f, err := flow.Get(ctx, s, spec.Key)
		if err != nil {
			return false, err
		}
		if !f.State.Finished() {
			return false, nil
		}
	}
	return true, nil
}

// demoFlowSummary prints each flow's end and checks it: succeeded, or for
// the failing one, failed with charge and reserve undone in that order.
func demoFlowSummary(ctx context.Context, w io.Writer, s task.Store, devices bool) error {
	var problems []error
	specs, err := demoFlows(devices)
	if err != nil {
		return err
	}
	for _, spec := range specs {
		f, err := flow.Get(ctx, s, spec.Key)
		if err != nil {
			return err
		}
		p := f.Progress
		line := fmt.Sprintf("  flow %s: %s", f.Key, f.State)
		want := flow.StateSucceeded
		if f.Key == demoFailingFlow {
			want = flow.StateFailed
			line += fmt.Sprintf(" (charge failed %d times; rolled back charge at %s, then reserve at %s)",
				p[1].Do.Failures, p[1].Undo.EndedAt.Format("15:04:05.000"), p[0].Undo.EndedAt.Format("15:04:05.000"))
			if p[1].Undo.State != flow.RunSucceeded || p[0].Undo.State != flow.RunSucceeded || p[0].Undo.StartedAt.Before(p[1].Undo.EndedAt) {
				problems = append(problems, fmt.Errorf("%s: rollbacks did not run in reverse", f.Key))
			}
		}
		fmt.Fprintln(w, line)
		if f.State != want {
			problems = append(problems, fmt.Errorf("%s ended %s, want %s", f.Key, f.State, want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("demo: flows: %w", errors.Join(problems...))
	}
	return nil
}
