package metrics_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/task"
)

// TestMalformedFlowDocumentKeepsStoreUp: a flow document that does not
// decode is skipped by the flow count, so the store still reads as up, the
// flows are counted, and the skipped document shows in
// leasepool_malformed_documents_total.
func TestMalformedFlowDocumentKeepsStoreUp(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	if _, _, err := flow.Publish(ctx, s, flow.Spec{Key: "good", Steps: []flow.Step{{Name: "a", Action: flow.Action{Kind: "noop"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: flow.Namespace, ID: "forged", Value: json.RawMessage(`{"steps":"x"}`)}); err != nil {
		t.Fatal(err)
	}
	col, err := metrics.NewStoreCollector(metrics.StoreConfig{Stats: s, Registry: s, Now: s.Now,
		Flows: metrics.FlowCounterFunc(func(ctx context.Context) (map[string]int64, error) {
			fs, err := flow.List(ctx, s, flow.ListQuery{})
			n := map[string]int64{}
			for _, f := range fs {
				n[string(f.State)]++
			}
			return n, err
		})})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	if got := value(t, reg, "leasepool_store_up"); got != 1 {
		t.Errorf("store_up = %v; want 1 over a malformed flow document", got)
	}
	if got := value(t, reg, "leasepool_flows", "state", "running"); got != 1 {
		t.Errorf("flows{running} = %v; want the good flow", got)
	}
	if got := value(t, reg, "leasepool_malformed_documents_total", "kind", flow.Namespace); got < 1 {
		t.Errorf("malformed_documents_total{kind=%q} = %v; want the forged document counted", flow.Namespace, got)
	}
}

// nonsenseStats reports an oldest ready time no task can have.
type nonsenseStats struct{ at time.Time }

func (n nonsenseStats) Stats(context.Context) (task.Stats, error) {
	return task.Stats{OldestReadyAt: n.at}, nil
}

// TestOldestReadyAgeIsSane: a task due at the far bound is not ready (no
// age); an oldest time outside what publish accepts reads as no age, never
// centuries.
func TestOldestReadyAgeIsSane(t *testing.T) {
	s := openStore(t)
	if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: "far", Kind: kind, Options: task.Options{RunAt: task.MaxTime}}); err != nil {
		t.Fatal(err)
	}
	for name, stats := range map[string]metrics.StatsReader{
		"store":  s,
		"1816":   nonsenseStats{time.Date(1816, 3, 4, 0, 0, 0, 0, time.UTC)},
		"future": nonsenseStats{time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		col, err := metrics.NewStoreCollector(metrics.StoreConfig{Stats: stats, Now: s.Now})
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(col)
		if got := value(t, reg, "leasepool_oldest_ready_task_age_seconds"); got != 0 {
			t.Errorf("%s: oldest ready age = %v; want 0", name, got)
		}
	}
}
