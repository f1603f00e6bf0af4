package metrics_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/task"
)

// storeReads counts every read a collector makes of the store.
type storeReads struct {
	task.Store
	n atomic.Int64
}

func (s *storeReads) Stats(ctx context.Context) (task.Stats, error) {
	s.n.Add(1)
	return s.Store.Stats(ctx)
}

func (s *storeReads) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	s.n.Add(1)
	return s.Store.Workers(ctx)
}

// TestStoreGaugesReadByTheElectedOnly: three processes' collectors on one
// store, scraped again and again with no MaxAge to hide behind: only the
// one whose Elected says so reads the store and exports the store's and
// the rollouts' gauges; the others read nothing and export none of them,
// not even figures read while they were elected.
func TestStoreGaugesReadByTheElectedOnly(t *testing.T) {
	s := openStore(t)
	publish(t, s, "a", 3)
	const n = 3
	var elected atomic.Int32
	reads := make([]*storeReads, n)
	regs := make([]*prometheus.Registry, n)
	for i := range n {
		reads[i] = &storeReads{Store: s}
		r := reads[i]
		isElected := func() bool { return elected.Load() == int32(i) }
		col, err := metrics.NewStoreCollector(metrics.StoreConfig{Stats: r, Registry: r, Now: s.Now, MaxAge: time.Nanosecond,
			Elected: isElected,
			Flows: metrics.FlowCounterFunc(func(context.Context) (map[string]int64, error) {
				r.n.Add(1)
				return map[string]int64{}, nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		rol, err := metrics.NewRolloutCollector(metrics.RolloutConfig{MaxAge: time.Nanosecond, Elected: isElected,
			Counter: metrics.RolloutCounterFunc(func(context.Context) ([]metrics.RolloutCount, error) {
				r.n.Add(1)
				return []metrics.RolloutCount{{Name: "fw", State: "running"}}, nil
			})})
		if err != nil {
			t.Fatal(err)
		}
		regs[i] = prometheus.NewPedanticRegistry()
		regs[i].MustRegister(col, rol)
	}
	const scrapes = 5
	for _, holder := range []int32{0, 2} {
		elected.Store(holder)
		before := make([]int64, n)
		for i := range n {
			before[i] = reads[i].n.Load()
		}
		for range scrapes {
			for i := range n {
				if _, err := regs[i].Gather(); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range n {
			got := reads[i].n.Load() - before[i]
			gauges := map[string]float64{
				"leasepool_store_up":    value(t, regs[i], "leasepool_store_up"),
				"leasepool_rollouts_up": value(t, regs[i], "leasepool_rollouts_up"),
				"leasepool_tasks":       value(t, regs[i], "leasepool_tasks", "state", "pending", "kind", kind),
				"leasepool_flows":       value(t, regs[i], "leasepool_flows", "state", "running"),
			}
			if int32(i) == holder {
				// Stats, workers, flows and rollouts: 4 reads a scrape.
				if want := int64(4 * scrapes); got != want {
					t.Errorf("elected collector %d: %d store reads in %d scrapes, want %d", i, got, scrapes, want)
				}
				for name, v := range gauges {
					if v < 0 {
						t.Errorf("elected collector %d: no %s", i, name)
					}
				}
				continue
			}
			if got != 0 {
				t.Errorf("collector %d, not elected: %d store reads, want none", i, got)
			}
			for name, v := range gauges {
				if v >= 0 {
					t.Errorf("collector %d, not elected: exports %s %v, want it left out", i, name, v)
				}
			}
		}
	}
}
