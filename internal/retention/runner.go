package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/task"
)

// RunnerConfig configures a Runner. Zero values take defaults.
type RunnerConfig struct {
	// Config is what each run deletes and how (Store required).
	Config
	// WorkerID names this process as the holder of the lease on LockKey.
	// Required.
	WorkerID string
	// Every is how often the holder runs; DefaultEvery when zero. A new
	// holder runs at once.
	Every time.Duration
	// Lease is how long the lease lasts without renewal: another process
	// takes over within about this long after the holder dies.
	// singleton.DefaultLease when zero.
	Lease time.Duration
}

// Runner runs retention in one process of the cluster at a time: in
// package worker as a duty of the elected worker (Duty); started alone,
// as a singleton (internal/singleton) on the lock key LockKey, where every
// process runs one and the holder of the lease deletes every Every. A run
// cut short (the lease lost, a stop, MaxPerRun reached) is carried on by
// the next.
type Runner struct {
	cfg    RunnerConfig
	runner *singleton.Runner
}

// NewRunner checks cfg and fills its defaults; Start runs it.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("retention: %w: store: required", task.ErrInvalid)
	}
	if err := task.ValidateName("worker id", cfg.WorkerID); err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	if cfg.Every < 0 {
		return nil, fmt.Errorf("retention: %w: every: %s is negative", task.ErrInvalid, cfg.Every)
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.MaxPerRun <= 0 {
		cfg.MaxPerRun = DefaultMaxPerRun
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runner{cfg: cfg}
	s, err := singleton.New(singleton.Config{
		Store: cfg.Store, Key: LockKey, HolderID: cfg.WorkerID, Lease: cfg.Lease,
		Run: r.loop, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	r.runner = s
	return r, nil
}

// Start starts the runner; ctx bounds startup only.
func (r *Runner) Start(ctx context.Context) error { return r.runner.Start(ctx) }

// Holding reports whether this process holds the lease now: one process
// of the cluster at a time, except for the instant of a takeover across a
// pause (internal/singleton).
func (r *Runner) Holding() bool { return r.runner.Running() }

// Stop ends a run in progress (the next holder carries on) and releases
// the lease, so a peer takes over at once. It may be called again.
func (r *Runner) Stop(ctx context.Context) error { return r.runner.Stop(ctx) }

// Duty runs retention every Every until ctx ends, with no lease of its
// own: the duty an elector runs while its process is elected (package
// worker registers it on the worker's one elector). Run a Runner by
// Start or by Duty, not both.
func (r *Runner) Duty(ctx context.Context) error { return r.loop(ctx) }

// loop runs retention every period while this process holds the lease.
func (r *Runner) loop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		n, err := Run(ctx, r.cfg.Config)
		if n.Total() > 0 || (err != nil && ctx.Err() == nil) {
			r.cfg.Logger.Info("retention: deleted finished tasks",
				slog.Int("succeeded", n[task.StateSucceeded]), slog.Int("failed", n[task.StateFailed]),
				slog.Int("cancelled", n[task.StateCancelled]), slog.Int("device_states", n[task.State(DeviceStateNamespace)]), slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
