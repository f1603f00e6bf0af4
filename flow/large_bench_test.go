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
	"github.com/leasepool/leasepool/internal/testutil"
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
		testutil.EventuallyEvery(b, time.Hour, 100*time.Millisecond, "the flow to finish", func() bool {
			f, err := flow.Get(ctx, s, "big")
			if err != nil {
				b.Fatal(err)
			}
			if f.State.Finished() && f.State != flow.StateSucceeded {
				b.Fatalf("flow %s: %s", f.State, f.Error)
			}
			return f.State.Finished()
		})
		b.ReportMetric(time.Since(start).Seconds(), "s/flow")
		c.Stop(ctx)
		s.Close()
	}
}

// BenchmarkReconcileTenThousand is one reconciler pass over a flow of
// flow.MaxSteps steps whose root succeeded and whose 9,999 other steps'
// tasks wait (no worker runs their kind): the pass reads the flow (from
// this process's parts) and its step tasks by pages of a list:
//
//	go test -run '^$' -bench ReconcileTenThousand -benchtime 5x ./flow/
func BenchmarkReconcileTenThousand(b *testing.B) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "tasks.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s}); err != nil {
		b.Fatal(err)
	}
	mux.RegisterFunc("quick", func(context.Context, *consumer.Job) error { return nil })
	c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w", Kinds: []string{"quick"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer c.Stop(ctx)
	steps := []flow.Step{{Name: "root", Action: flow.Action{Kind: "quick"}}}
	for i := 1; i < flow.MaxSteps; i++ {
		steps = append(steps, flow.Step{Name: fmt.Sprintf("s%d", i), Needs: []string{"root"}, Action: flow.Action{Kind: "idle"}})
	}
	if _, _, err := flow.Publish(ctx, s, flow.Spec{Key: "wide", Steps: steps}); err != nil {
		b.Fatal(err)
	}
	testutil.EventuallyEvery(b, time.Hour, 50*time.Millisecond, "the root to succeed", func() bool {
		f, err := flow.Get(ctx, s, "wide")
		if err != nil {
			b.Fatal(err)
		}
		return f.Progress[0].Do.State == flow.RunSucceeded
	})
	// The root's write comes before its publish of the 9,999: a first
	// pass publishes what is not yet there (by key: once).
	if _, err := flow.Reconcile(ctx, s, nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		st, err := flow.Reconcile(ctx, s, nil)
		if err != nil || st.Active != 1 || st.Published != 0 {
			b.Fatalf("%+v %v", st, err)
		}
	}
}
