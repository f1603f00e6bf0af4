package flow

import (
	"context"
	"fmt"
	"testing"

	"github.com/leasepool/leasepool/task"
)

// BenchmarkReconcile measures one reconciler pass over 50 moving flows
// among a backlog of 20 000 pending plain tasks on the embedded store: the
// pass lists pending tasks of the flow kind, and no index covers kind.
//
//	go test -run '^$' -bench Reconcile -benchtime 20x ./flow
func BenchmarkReconcile(b *testing.B) {
	ctx := context.Background()
	s := openStore(b)
	for i := range 20_000 {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprintf("backlog-%05d", i), Kind: "other"}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 50 {
		if _, _, err := Publish(ctx, s, Spec{Key: fmt.Sprintf("f%02d", i), Steps: threeSteps()}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		st, err := Reconcile(ctx, s, nil)
		if err != nil || st.Active != 50 {
			b.Fatalf("%+v %v", st, err)
		}
	}
}

// BenchmarkValidateTenThousand validates flows of MaxSteps steps: a
// chain (each step needing the one before, the deepest cycle search) and
// a fan-in (one step needing every other):
//
//	go test -run '^$' -bench ValidateTenThousand ./flow
func BenchmarkValidateTenThousand(b *testing.B) {
	chain := Spec{Key: "chain"}
	fanIn := Spec{Key: "fan-in"}
	var all []string
	for i := range MaxSteps {
		st := Step{Name: fmt.Sprintf("s%d", i), Action: Action{Kind: "noop"}}
		if i > 0 {
			st.Needs = []string{fmt.Sprintf("s%d", i-1)}
		}
		chain.Steps = append(chain.Steps, st)
		last := Step{Name: st.Name, Action: st.Action}
		if i == MaxSteps-1 {
			last.Needs = all
		} else {
			all = append(all, st.Name)
		}
		fanIn.Steps = append(fanIn.Steps, last)
	}
	for _, s := range []Spec{chain, fanIn} {
		b.Run(s.Key, func(b *testing.B) {
			for b.Loop() {
				if err := s.Validate(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
