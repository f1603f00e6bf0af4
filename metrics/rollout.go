package metrics

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RolloutCount is one rollout's devices by outcome, and its state.
type RolloutCount struct {
	Name  string
	State string
	// Outcomes counts the rollout's executions by outcome (queued,
	// running, succeeded, failed, refused, timed_out, offline, cancelled,
	// skipped).
	Outcomes map[string]int64
}

// RolloutCounter reads every rollout's counts (rollout.List, counted).
type RolloutCounter interface {
	RolloutCounts(ctx context.Context) ([]RolloutCount, error)
}

// RolloutCounterFunc adapts a function to RolloutCounter.
type RolloutCounterFunc func(ctx context.Context) ([]RolloutCount, error)

// RolloutCounts calls f.
func (f RolloutCounterFunc) RolloutCounts(ctx context.Context) ([]RolloutCount, error) { return f(ctx) }

// RolloutOutcomes are the outcomes leasepool_rollout_devices is exported
// for, each rollout always all of them (0 when none), so an alert on
// failed has a series from the start.
var RolloutOutcomes = []string{"queued", "running", "succeeded", "failed", "refused", "timed_out", "offline", "cancelled", "skipped"}

// RolloutConfig configures a RolloutCollector.
type RolloutConfig struct {
	// Counter reads the rollouts. Required.
	Counter RolloutCounter
	// MaxAge is how long figures read are reused. Default 5s.
	MaxAge time.Duration
	// Timeout bounds each read. Default 5s.
	Timeout time.Duration
	// Logger gets failed reads; nil discards them.
	Logger *slog.Logger
	// Elected, as StoreConfig.Elected: while it returns false the
	// collector reads nothing and exports none of the rollout gauges.
	// Nil: always.
	Elected func() bool
}

// RolloutCollector exports each rollout's devices by outcome
// (leasepool_rollout_devices{rollout,outcome}) and its state
// (leasepool_rollout_state{rollout,state} 1), read from the store at most
// once per MaxAge, as StoreCollector reads its gauges (and with Elected
// only while elected). A failed read exports none of them and
// leasepool_rollouts_up 0.
type RolloutCollector struct {
	cfg                RolloutConfig
	devices, state, up *prometheus.Desc

	mu     sync.Mutex
	readAt time.Time
	counts []RolloutCount
	err    error
}

// NewRolloutCollector checks cfg and returns a collector to register.
func NewRolloutCollector(cfg RolloutConfig) (*RolloutCollector, error) {
	if cfg.Counter == nil {
		return nil, errors.New("metrics rollout collector: Counter is required")
	}
	if err := readSettings("rollout collector", &cfg.MaxAge, &cfg.Timeout, &cfg.Logger); err != nil {
		return nil, err
	}
	return &RolloutCollector{
		cfg: cfg,
		devices: prometheus.NewDesc(namespace+"_rollout_devices", "Devices of each rollout by the outcome of their execution.",
			[]string{"rollout", "outcome"}, nil),
		state: prometheus.NewDesc(namespace+"_rollout_state", "Each rollout's state (1 for the state it is in).",
			[]string{"rollout", "state"}, nil),
		up: prometheus.NewDesc(namespace+"_rollouts_up", "1 when the last read of the rollouts succeeded, 0 when it failed.", nil, nil),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *RolloutCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.devices
	ch <- c.state
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *RolloutCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.Elected != nil && !c.cfg.Elected() {
		c.readAt = time.Time{}
		return
	}
	if c.readAt.IsZero() || time.Since(c.readAt) >= c.cfg.MaxAge {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		c.counts, c.err = c.cfg.Counter.RolloutCounts(ctx)
		cancel()
		c.readAt = time.Now()
		if c.err != nil {
			c.cfg.Logger.Warn("metrics: rollouts", slog.Any("err", c.err))
		}
	}
	if c.err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, r := range c.counts {
		for _, o := range RolloutOutcomes {
			ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(r.Outcomes[o]), r.Name, o)
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, 1, r.Name, r.State)
	}
}
