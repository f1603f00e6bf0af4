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
