// Package bench measures a leasepool deployment the way `leasepool bench`
// reports it: publish-to-start latency in one process and across
// processes, noop throughput, takeover time after a worker is SIGKILLed
// and worker memory. It also holds the statistics (nearest-rank
// percentiles, medians) and process helpers that the peers' harness in
// tests/bench uses, so both measure alike.
//
// Worker processes are started by Config.WorkerCommand: the bench does not
// assume which binary runs them.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"

	"github.com/leasepool/leasepool/internal/redact"
	"github.com/leasepool/leasepool/task"
)

// Defaults of Config's zero values.
const (
	DefaultLatencyTasks    = 2000
	DefaultThroughputTasks = 20000
	DefaultConcurrency     = 32
	DefaultRuns            = 3
)

// Config says what to measure and how to start worker processes.
type Config struct {
	// Store is the store to measure; Run leaves it open.
	Store task.Store
	// StoreURL names Store to the worker processes (see package store),
	// and in the report. Required.
	StoreURL string
	// LatencyTasks are published, 2 ms apart, in each latency run.
	// Default DefaultLatencyTasks.
	LatencyTasks int
	// ThroughputTasks are drained in each throughput run. Default
	// DefaultThroughputTasks.
	ThroughputTasks int
	// Concurrency of the worker in the throughput and memory runs.
	// Default DefaultConcurrency.
	Concurrency int
	// Runs of the throughput measure; the median is reported. Default
	// DefaultRuns.
	Runs int
	// PendingTasks are held, delayed, by a worker for the memory figure;
	// 0 skips it.
	PendingTasks int
	// ThroughputOnly measures the worker process's throughput alone (Runs
	// runs), for a driver that interleaves runs of several systems so that
	// a slow spell of the machine falls on each of them.
	ThroughputOnly bool
	// WorkerCommand returns a command (not started) that runs a worker
	// process on storeURL with this worker id and concurrency, claiming
	// the built-in kinds noop and sleep, until SIGTERM; for example
	// `leasepool --store URL worker --kinds noop,sleep --id ID --concurrency N`.
	// Required.
	WorkerCommand func(storeURL, id string, concurrency int) *exec.Cmd
	// Progress receives one-line progress, each overwriting the last.
	// Default: none.
	Progress io.Writer
	// Logger is the in-process worker's. Default slog.Default().
	Logger *slog.Logger
}

// Result is what Run measured.
type Result struct {
	Report  Report
	Samples Samples
}

func (c *Config) withDefaults() (Config, error) {
	d := *c
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"LatencyTasks", &d.LatencyTasks, DefaultLatencyTasks},
		{"ThroughputTasks", &d.ThroughputTasks, DefaultThroughputTasks},
		{"Concurrency", &d.Concurrency, DefaultConcurrency},
		{"Runs", &d.Runs, DefaultRuns},
		{"PendingTasks", &d.PendingTasks, 0},
	} {
		if *f.v < 0 {
			return d, fmt.Errorf("%w: bench: %s must not be negative, got %d", task.ErrInvalid, f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if d.Store == nil || d.StoreURL == "" || d.WorkerCommand == nil {
		return d, fmt.Errorf("%w: bench: Store, StoreURL and WorkerCommand are required", task.ErrInvalid)
	}
	if d.Progress == nil {
		d.Progress = io.Discard
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return d, nil
}

// Run measures, one step after another, and returns the figures. It takes
// minutes with the defaults.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &bench{ctx: ctx, cfg: c, store: c.Store, res: &Result{Report: Report{
		Store: redact.URL(c.StoreURL), LatencyTasks: c.LatencyTasks, ThroughputTasks: c.ThroughputTasks,
		Concurrency: c.Concurrency, PendingTasks: c.PendingTasks,
	}}}
	b.report = &b.res.Report
	steps := []struct {
		name string
		fn   func() error
	}{
		{"latency in one process", b.latencyInProcess},
		{"latency across processes", b.latencyCrossProcess},
		{"throughput", b.throughput},
		{"takeover", b.takeover},
		{"memory with pending tasks", b.pendingMemory},
	}
	if c.ThroughputOnly {
		steps = steps[2:3] // throughput
	}
	for _, s := range steps {
		b.progress("%s...", s.name)
		if err := s.fn(); err != nil {
			return nil, fmt.Errorf("bench %s: %w", s.name, err)
		}
	}
	b.progress("done\n")
	return b.res, nil
}

// bench is one Run in progress.
type bench struct {
	ctx    context.Context
	cfg    Config
	store  task.Store
	res    *Result
	report *Report // &res.Report
	round  int
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.cfg.Progress, "\r\033[K"+format, args...)
}

// keyPrefix names the tasks of one measure apart from every other's, and
// from another bench's on the same store.
func (b *bench) keyPrefix(what string) string {
	b.round++
	return fmt.Sprintf("bench-%d-%s-%d-", os.Getpid(), what, b.round)
}
