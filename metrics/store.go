package metrics

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasepool/leasepool/task"
)

// StatsReader reads the task counts per state and kind and the oldest
// ready task in one bounded query: task.Store's Stats.
type StatsReader interface {
	Stats(ctx context.Context) (task.Stats, error)
}

// FlowCounter counts the flows per state (flow.List, counted); the
// rollback_failed count is the alert that a flow needs a human.
type FlowCounter interface {
	FlowStates(ctx context.Context) (map[string]int64, error)
}

// FlowCounterFunc adapts a function to FlowCounter.
type FlowCounterFunc func(ctx context.Context) (map[string]int64, error)

// FlowStates calls f.
func (f FlowCounterFunc) FlowStates(ctx context.Context) (map[string]int64, error) { return f(ctx) }

// StoreConfig configures a StoreCollector.
type StoreConfig struct {
	// Stats reads the task counts (usually the task.Store); nil exports
	// no task gauges.
	Stats StatsReader
	// Registry lists the workers; nil exports no worker gauge.
	Registry task.Registry
	// Flows counts the flows per state; nil exports no flow gauge.
	Flows FlowCounter
	// Now is the store's clock (task.Store.Now): ages and worker liveness
	// are judged in it. Required.
	Now func() time.Time
	// MaxAge is how long figures read are reused: scrapes within it cost
	// no query. Default 5s.
	MaxAge time.Duration
	// Timeout bounds each read. Default 5s.
	Timeout time.Duration
	// Logger gets failed reads; nil discards them.
	Logger *slog.Logger
	// Elected, when set, says whether this process reads and exports the
	// store's gauges now. The gauges are the cluster's, the same from
	// every process: among many workers one at a time (the elected one,
	// worker.Worker.Elected) serves them, so that scrapes cost the store once per cluster, not
	// once per worker. While it returns false the collector reads nothing
	// and exports none of the store's gauges, leasepool_store_up included
	// (the malformed documents counter, this process's own, stays). Nil:
	// always.
	Elected func() bool
}

// StoreCollector is a prometheus.Collector of the store's gauges. However
// often it is scraped, it reads the store at most once per MaxAge (one
// stats query and one registry listing), and concurrent scrapes share a
// read; with Elected, only while elected.
type StoreCollector struct {
	cfg StoreConfig

	tasks, oldest, workers, flows, up, malformed *prometheus.Desc

	mu     sync.Mutex
	readAt time.Time // local clock
	snap   snapshot
	seen   map[stateKind]bool // pairs exported once: kept at 0 when gone
}

type snapshot struct {
	stats     task.Stats
	statsErr  error
	workers   int
	workerErr error
	flows     map[string]int64
	flowErr   error
	now       time.Time
}

// NewStoreCollector checks cfg and returns a collector to register.
func NewStoreCollector(cfg StoreConfig) (*StoreCollector, error) {
	if cfg.Now == nil {
		return nil, errors.New("metrics store collector: Now is required")
	}
	if err := readSettings("store collector", &cfg.MaxAge, &cfg.Timeout, &cfg.Logger); err != nil {
		return nil, err
	}
	return &StoreCollector{
		cfg: cfg,
		tasks: prometheus.NewDesc(namespace+"_tasks", "Tasks in the store by state and kind.",
			[]string{"state", "kind"}, nil),
		oldest: prometheus.NewDesc(namespace+"_oldest_ready_task_age_seconds",
			"How long the longest-waiting claimable task has been claimable (0: none ready).", nil, nil),
		workers: prometheus.NewDesc(namespace+"_workers_live", "Worker processes whose registry record is live.", nil, nil),
		flows: prometheus.NewDesc(namespace+"_flows", "Flows in the store by state (rollback_failed: a flow needs a human).",
			[]string{"state"}, nil),
		up: prometheus.NewDesc(namespace+"_store_up",
			"1 when the collector's last store read succeeded, 0 when it failed (the gauges it feeds are then left out).", nil, nil),
		malformed: prometheus.NewDesc(namespace+"_malformed_documents_total",
			"Documents of leasepool's own (flows, pauses, limits, schedules and their cursors, device states, the retention "+
				"policy) that this process's readers could not read and skipped, by kind (their namespace); each is logged once.", []string{"kind"}, nil),
		seen: map[stateKind]bool{},
	}, nil
}

// readSettings checks the read settings a collector's config shares
// (MaxAge, Timeout, Logger) and fills in their defaults; what names the
// collector in the error.
func readSettings(what string, maxAge, timeout *time.Duration, logger **slog.Logger) error {
	if *maxAge < 0 || *timeout < 0 {
		return errors.New("metrics " + what + ": MaxAge and Timeout must not be negative")
	}
	for _, d := range []*time.Duration{maxAge, timeout} {
		if *d == 0 {
			*d = 5 * time.Second
		}
	}
	if *logger == nil {
		*logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (s *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.tasks, s.oldest, s.workers, s.flows, s.up, s.malformed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Elected != nil && !s.cfg.Elected() {
		// Figures read in an earlier term are not served: the elected
		// process's are newer.
		s.readAt = time.Time{}
		s.collectMalformed(ch)
		return
	}
	if s.readAt.IsZero() || time.Since(s.readAt) >= s.cfg.MaxAge {
		s.snap = s.read()
		s.readAt = time.Now()
	}
	ok := 1.0
	if s.snap.statsErr != nil || s.snap.workerErr != nil || s.snap.flowErr != nil {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(s.up, prometheus.GaugeValue, ok)
	if s.cfg.Stats != nil && s.snap.statsErr == nil {
		s.collectTasks(ch)
	}
	if s.cfg.Registry != nil && s.snap.workerErr == nil {
		ch <- prometheus.MustNewConstMetric(s.workers, prometheus.GaugeValue, float64(s.snap.workers))
	}
	if s.cfg.Flows != nil && s.snap.flowErr == nil {
		for _, state := range FlowStates {
			ch <- prometheus.MustNewConstMetric(s.flows, prometheus.GaugeValue, float64(s.snap.flows[state]), state)
		}
	}
	s.collectMalformed(ch)
}

func (s *StoreCollector) collectMalformed(ch chan<- prometheus.Metric) {
	for kind, n := range task.MalformedCounts() {
		ch <- prometheus.MustNewConstMetric(s.malformed, prometheus.CounterValue, float64(n), kind)
	}
}

// FlowStates are the states leasepool_flows is exported for, always all of
// them (0 when none), so an alert on rollback_failed has a series to read.
var FlowStates = []string{"pending", "running", "rolling_back", "succeeded", "failed", "rollback_failed", "cancelled"}

// collectTasks exports the counts, with 0 for pairs seen before and gone
// now, so a state that empties reads 0 rather than vanishing.
func (s *StoreCollector) collectTasks(ch chan<- prometheus.Metric) {
	st := s.snap.stats
	now := map[stateKind]int64{}
	for _, c := range st.Counts {
		k := stateKind{c.State, c.Kind}
		now[k] += c.N
		s.seen[k] = true
	}
	for k := range s.seen {
		ch <- prometheus.MustNewConstMetric(s.tasks, prometheus.GaugeValue, float64(now[k]), string(k.state), k.kind)
	}
	age := 0.0
	// A time outside what publish accepts cannot be a task's: no age.
	if at := st.OldestReadyAt; !at.IsZero() && !at.Before(task.MinTime) && !at.After(task.MaxTime) {
		age = max(s.snap.now.Sub(at).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(s.oldest, prometheus.GaugeValue, age)
}

// read queries the store once for everything the collector exports.
func (s *StoreCollector) read() snapshot {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	var snap snapshot
	if s.cfg.Stats != nil {
		snap.stats, snap.statsErr = s.cfg.Stats.Stats(ctx)
		if snap.statsErr != nil {
			s.cfg.Logger.Warn("metrics: store stats", slog.Any("err", snap.statsErr))
		}
	}
	snap.now = s.cfg.Now()
	if s.cfg.Registry != nil {
		ws, err := s.cfg.Registry.Workers(ctx)
		for _, w := range ws {
			if w.Live(snap.now) {
				snap.workers++
			}
		}
		if snap.workerErr = err; err != nil {
			s.cfg.Logger.Warn("metrics: worker registry", slog.Any("err", err))
		}
	}
	if s.cfg.Flows != nil {
		if snap.flows, snap.flowErr = s.cfg.Flows.FlowStates(ctx); snap.flowErr != nil {
			s.cfg.Logger.Warn("metrics: flows", slog.Any("err", snap.flowErr))
		}
	}
	return snap
}

type stateKind struct {
	state task.State
	kind  string
}
