package main

// The demo's flows: a few orders of three sleep steps with rollbacks, one
// failing at its second step, so its rollbacks run in reverse while a
// worker is killed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

// demoFlowCount is how many flows the demo publishes; demoFailingFlow is
// the one that fails at "charge".
const (
	demoFlowCount   = 4
	demoFailingFlow = "order-3"
)

func demoFlowSpecs() []flow.Spec {
	sleep := func(d time.Duration, fail bool) flow.Action {
		b, _ := json.Marshal(map[string]any{"duration": d.String(), "fail": fail})
		one, many := 1, 10
		if fail {
			return flow.Action{Kind: "sleep", Payload: b, Retries: &one}
		}
		return flow.Action{Kind: "sleep", Payload: b, Retries: &many}
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

func publishDemoFlows(ctx context.Context, w io.Writer, s task.Store) error {
	for _, spec := range demoFlowSpecs() {
		if _, _, err := flow.Publish(ctx, s, spec); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "published %d flows (reserve, charge, ship; %s fails at charge and rolls back)\n", demoFlowCount, demoFailingFlow)
	return nil
}

// demoFlowSummary prints each flow's end and checks it: succeeded, or for
// the failing one, failed with charge and reserve undone in that order.
func demoFlowSummary(ctx context.Context, w io.Writer, s task.Store) error {
	var problems []error
	for _, spec := range demoFlowSpecs() {
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
