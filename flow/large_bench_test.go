package flow_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkTenThousandStepFlow runs a flow of flow.MaxSteps steps (a
// root, 99 steps needing it, 100 leaves needing each) of instant steps
// on one in-process worker of 32 slots, on the embedded store. With
// LEASEPOOL_BENCH_KEEP=DIR the store is DIR/tasks.db and stays, for the
// flow page and flow show to be timed on it (docs/performance.md):
//
//	go test -run '^$' -bench TenThousandStepFlow -benchtime 1x ./flow/
func BenchmarkTenThousandStepFlow(b *testing.B) {
	for b.Loop() {
		ctx := context.Background()
		dir := os.Getenv("LEASEPOOL_BENCH_KEEP")
		if dir == "" {
			dir = b.TempDir()
		}
		s, err := sqlitestore.Open(ctx, filepath.Join(dir, "tasks.db"), nil)
		if err != nil {
			b.Fatal(err)
		}
		mux := consumer.NewMux()
		if err := flow.Register(mux, flow.Config{Store: s}); err != nil {
			b.Fatal(err)
		}
		mux.RegisterFunc("quick", func(context.Context, *consumer.Job) error { return nil })
		c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w", Concurrency: 32})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
		act := flow.Action{Kind: "quick"}
		steps := []flow.Step{{Name: "root", Action: act}}
		for m := range 99 {
			steps = append(steps, flow.Step{Name: fmt.Sprintf("m%02d", m), Needs: []string{"root"}, Action: act})
		}
		for m := range 99 {
			for l := range 100 {
				steps = append(steps, flow.Step{Name: fmt.Sprintf("l%02d-%02d", m, l), Needs: []string{fmt.Sprintf("m%02d", m)}, Action: act})
			}
		}
		start := time.Now()
		if _, _, err := flow.Publish(ctx, s, flow.Spec{Key: "big", Steps: steps}); err != nil {
			b.Fatal(err)
		}
		for {
			f, err := flow.Get(ctx, s, "big")
			if err != nil {
				b.Fatal(err)
			}
			if f.State.Finished() {
				if f.State != flow.StateSucceeded {
					b.Fatalf("flow %s: %s", f.State, f.Error)
				}
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/flow")
		c.Stop(ctx)
		s.Close()
	}
}
