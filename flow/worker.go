package flow

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/task"
)

// Config wires flows into a worker.
type Config struct {
	Store  task.Store
	Logger *slog.Logger
	// ExecKind: see MiddlewareConfig.
	ExecKind string
}

// Register adds Middleware to mux and registers TimerKind, which the
// worker's consumer must claim (worker.New adds it to the kinds), as an
// instant kind: a timer that falls due is claimed even while every slot
// runs a handler. Run a Reconciler beside the consumer.
func Register(mux *consumer.Mux, cfg Config) error {
	if cfg.Store == nil {
		return fmt.Errorf("flow: %w: store: required", task.ErrInvalid)
	}
	mux.Use(Middleware(MiddlewareConfig(cfg)))
	// Middleware runs a timer before any handler; this one only sees a
	// task of the kind that is no timer of a flow.
	mux.RegisterInstant(TimerKind, consumer.HandlerFunc(func(context.Context, *consumer.Job) error {
		return fmt.Errorf("flow: %w: a %s task that names no flow step", task.ErrInvalid, TimerKind)
	}))
	return nil
}

// The reconciler runs in one process at a time: in package worker, as a
// duty of the elected worker (Reconciler.Duty on the worker's elector);
// alone, by Start, as a singleton (internal/singleton) on the lock key
// ReconcileLockKey, where every process runs a Reconciler, the one
// holding the lease reconciles every period, and another takes over
// within a lease (three periods) after it dies. A lease
// rather than a repeatable task: a task every few seconds would add
// thousands of tasks a day to the tasks table. Two passes at once are
// harmless anyway (every change Reconcile makes is a compare-and-set that
// applies once), but the runner ends a pass whose lease runs out.
const (
	ReconcileLockKey = "leasepool.flow-reconcile"
	// DefaultReconcileEvery is how often the holder reconciles: about the
	// longest a flow waits after a crash between its write and its next
	// publish, or after a step task failed by expired leases.
	DefaultReconcileEvery = 5 * time.Second
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	Store task.Store
	// WorkerID names the holder in the lock table (the worker's id).
	WorkerID string
	// Every is the period (DefaultReconcileEvery), and the lease's renewal
	// period; the lease is three periods (at least singleton.MinLease).
	Every time.Duration
	// KeepStopped is how long the document of a stopped flow is kept
	// after it stopped (DefaultKeepStopped); the holder deletes older
	// ones. Its step tasks follow the task retention policy.
	KeepStopped time.Duration
	Logger      *slog.Logger
}

// DefaultKeepStopped keeps a stopped flow a day, as the default retention
// policy keeps a cancelled task.
const DefaultKeepStopped = 24 * time.Hour

// Reconciler runs Reconcile every period while it holds the lease.
type Reconciler struct {
	cfg    ReconcilerConfig
	runner *singleton.Runner
}

// NewReconciler checks cfg and fills its defaults.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("flow reconciler: %w: store: required", task.ErrInvalid)
	}
	if err := task.ValidateName("worker id", cfg.WorkerID); err != nil {
		return nil, fmt.Errorf("flow reconciler: %w", err)
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultReconcileEvery
	}
	if cfg.KeepStopped <= 0 {
		cfg.KeepStopped = DefaultKeepStopped
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Reconciler{cfg: cfg}
	runner, err := singleton.New(singleton.Config{
		Store: cfg.Store, Key: ReconcileLockKey, HolderID: cfg.WorkerID,
		Lease: max(3*cfg.Every, singleton.MinLease), Renew: cfg.Every,
		Run: r.loop, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("flow reconciler: %w", err)
	}
	r.runner = runner
	return r, nil
}

// Start starts the loop; ctx bounds startup only.
func (r *Reconciler) Start(ctx context.Context) error { return r.runner.Start(ctx) }

// Stop ends the loop and gives the lease up, so a peer takes over at once.
func (r *Reconciler) Stop(ctx context.Context) error { return r.runner.Stop(ctx) }

// Duty reconciles every Every until ctx ends, with no lease of its own:
// the duty an elector runs while its process is elected (package worker
// registers it on the worker's one elector). Run a Reconciler by Start or
// by Duty, not both.
func (r *Reconciler) Duty(ctx context.Context) error { return r.loop(ctx) }

// loop reconciles every period while this process holds the lease.
func (r *Reconciler) loop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		st, err := Reconcile(ctx, r.cfg.Store, r.cfg.Logger)
		if st.Advanced+st.Published > 0 || (err != nil && ctx.Err() == nil) {
			r.cfg.Logger.Info("flow reconcile", slog.Int("active", st.Active), slog.Int("advanced", st.Advanced),
				slog.Int("published", st.Published), slog.Any("err", err))
		}
		n, err := DeleteStopped(ctx, r.cfg.Store, r.cfg.Store.Now().Add(-r.cfg.KeepStopped), 500)
		if n > 0 || (err != nil && ctx.Err() == nil) {
			r.cfg.Logger.Info("flow retention", slog.Int("deleted", n), slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
