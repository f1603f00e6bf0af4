package metrics_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestStoreWritesExportsTheStoreCounts: the series carry what the
// embedded store counted, read at the scrape.
func TestStoreWritesExportsTheStoreCounts(t *testing.T) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewStoreWrites(func() metrics.WriteCounts { return metrics.WriteCounts(s.WriteStats()) }))
	for i := range 3 {
		if _, _, err := task.Publish(context.Background(), s, task.PublishParams{Key: fmt.Sprint(i), Kind: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	before := s.WriteStats()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	after := s.WriteStats()
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = m.GetCounter().GetValue()
		}
	}
	within := func(name string, lo, hi float64) {
		t.Helper()
		if v, ok := got[name]; !ok || v < lo || v > hi {
			t.Errorf("%s = %v (exported: %t), want within [%v, %v]", name, v, ok, lo, hi)
		}
	}
	// The store's checkpointer may commit between the reads.
	within("leasepool_store_commits_total", float64(before.Commits), float64(after.Commits))
	within("leasepool_store_committed_writes_total", float64(before.Writes), float64(after.Writes))
	within("leasepool_store_write_lock_wait_seconds_total", before.LockWait.Seconds(), after.LockWait.Seconds())
	within("leasepool_store_write_lock_held_seconds_total", before.LockHeld.Seconds(), after.LockHeld.Seconds())
	within("leasepool_store_write_phase_seconds_total/begin", before.Begin.Seconds(), after.Begin.Seconds())
	within("leasepool_store_write_phase_seconds_total/statements", before.Statements.Seconds(), after.Statements.Seconds())
	within("leasepool_store_write_phase_seconds_total/commit", before.Commit.Seconds(), after.Commit.Seconds())
	if got["leasepool_store_committed_writes_total"] < 3 || got["leasepool_store_write_lock_held_seconds_total"] <= 0 ||
		got["leasepool_store_write_phase_seconds_total/statements"] <= 0 || got["leasepool_store_write_phase_seconds_total/commit"] <= 0 {
		t.Errorf("after 3 publishes: %v", got)
	}
}
