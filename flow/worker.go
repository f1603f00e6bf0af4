package flow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/task"
)

// Config wires flows into a worker.
type Config struct {
	Store  task.Store
	Logger *slog.Logger
	// ExecKind: see MiddlewareConfig.
	ExecKind string
}

// Register adds Middleware to mux. Run a Reconciler beside the consumer.
func Register(mux *consumer.Mux, cfg Config) error {
	if cfg.Store == nil {
		return fmt.Errorf("flow: %w: store: required", task.ErrInvalid)
	}
	mux.Use(Middleware(MiddlewareConfig(cfg)))
	return nil
}

// The reconciler runs under a lease in the lock table, as the embedded
// broker's host does: every worker runs a Reconciler, the one holding the
// lock ReconcileLockKey reconciles every period, and another takes over
// within a few periods after it dies. A lease rather than a repeatable
// task: a task every few seconds would add thousands of tasks a day to
// the tasks table. Two reconcilers at once (a lease that lapsed under
// load) are harmless: every change Reconcile makes is a compare-and-set
// that applies once.
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
	// Every is the period (DefaultReconcileEvery); the lease is three.
	Every  time.Duration
	Logger *slog.Logger
}

// Reconciler runs Reconcile every period while it holds the lease.
type Reconciler struct {
	cfg    ReconcilerConfig
	holder task.Holder
	run    lifecycle.Runner
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
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &Reconciler{cfg: cfg, holder: task.Holder{TaskKey: ReconcileLockKey, WorkerID: cfg.WorkerID, Instance: hex.EncodeToString(b)}}, nil
}

// Start starts the loop; ctx bounds startup only.
func (r *Reconciler) Start(ctx context.Context) error {
	run, err := r.run.Start(ctx)
	if err != nil {
		return err
	}
	r.run.Go(func() { r.loop(run) })
	return nil
}

// Stop ends the loop and gives the lease up, so a peer takes over at once.
func (r *Reconciler) Stop(ctx context.Context) error {
	return r.run.Stop(ctx, func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.cfg.Store.ReleaseLocks(rctx, task.LockParams{Keys: []string{ReconcileLockKey}, Holder: r.holder})
	})
}

func (r *Reconciler) loop(ctx context.Context) {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		r.tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick takes or renews the lease and, holding it, reconciles once.
func (r *Reconciler) tick(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Every)
	defer cancel()
	now := r.cfg.Store.Now()
	err := r.cfg.Store.AcquireLocks(ctx, task.LockParams{Keys: []string{ReconcileLockKey}, Holder: r.holder, Now: now, Until: now.Add(3 * r.cfg.Every)})
	if err != nil {
		if !errors.Is(err, task.ErrLocked) { // a peer holding it is the normal case
			r.cfg.Logger.Debug("flow reconcile: lease not taken", slog.Any("err", err))
		}
		return // next tick
	}
	st, err := Reconcile(ctx, r.cfg.Store, r.cfg.Logger)
	if st.Advanced+st.Published > 0 || err != nil {
		r.cfg.Logger.Info("flow reconcile", slog.Int("active", st.Active), slog.Int("advanced", st.Advanced),
			slog.Int("published", st.Published), slog.Any("err", err))
	}
}
