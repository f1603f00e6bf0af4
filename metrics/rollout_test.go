package metrics_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leasepool/leasepool/metrics"
)

func TestRolloutCollector(t *testing.T) {
	t.Parallel()
	var reads atomic.Int32
	fail := atomic.Bool{}
	c, err := metrics.NewRolloutCollector(metrics.RolloutConfig{Counter: metrics.RolloutCounterFunc(func(context.Context) ([]metrics.RolloutCount, error) {
		reads.Add(1)
		if fail.Load() {
			return nil, errors.New("store down")
		}
		return []metrics.RolloutCount{{Name: "fw-2", State: "running", Outcomes: map[string]int64{"succeeded": 7, "failed": 1, "running": 2}}}, nil
	}), MaxAge: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	want := `
# HELP leasepool_rollout_devices Devices of each rollout by the outcome of their execution.
# TYPE leasepool_rollout_devices gauge
leasepool_rollout_devices{outcome="cancelled",rollout="fw-2"} 0
leasepool_rollout_devices{outcome="failed",rollout="fw-2"} 1
leasepool_rollout_devices{outcome="offline",rollout="fw-2"} 0
leasepool_rollout_devices{outcome="queued",rollout="fw-2"} 0
leasepool_rollout_devices{outcome="refused",rollout="fw-2"} 0
leasepool_rollout_devices{outcome="running",rollout="fw-2"} 2
leasepool_rollout_devices{outcome="skipped",rollout="fw-2"} 0
leasepool_rollout_devices{outcome="succeeded",rollout="fw-2"} 7
leasepool_rollout_devices{outcome="timed_out",rollout="fw-2"} 0
# HELP leasepool_rollout_state Each rollout's state (1 for the state it is in).
# TYPE leasepool_rollout_state gauge
leasepool_rollout_state{rollout="fw-2",state="running"} 1
# HELP leasepool_rollouts_up 1 when the last read of the rollouts succeeded, 0 when it failed.
# TYPE leasepool_rollouts_up gauge
leasepool_rollouts_up 1
`
	for range 3 {
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Fatal(err)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads for three scrapes within MaxAge, want 1", n)
	}
	fail.Store(true)
	c2, _ := metrics.NewRolloutCollector(metrics.RolloutConfig{Counter: metrics.RolloutCounterFunc(func(context.Context) ([]metrics.RolloutCount, error) {
		return nil, errors.New("store down")
	})})
	reg2 := prometheus.NewRegistry()
	reg2.MustRegister(c2)
	if err := testutil.GatherAndCompare(reg2, strings.NewReader("# HELP leasepool_rollouts_up 1 when the last read of the rollouts succeeded, 0 when it failed.\n# TYPE leasepool_rollouts_up gauge\nleasepool_rollouts_up 0\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewRolloutCollector(metrics.RolloutConfig{}); err == nil {
		t.Error("no counter: no error")
	}
}
