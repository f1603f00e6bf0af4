package flow

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// The reconciler runs as a repeatable maintenance task, as retention does:
// a built-in schedule publishes it, its lock key lets one run at a time,
// and a crashed worker's run is taken over like any task's.
const (
	ReconcileKind     = "leasepool.flow-reconcile"
	ReconcileSchedule = "leasepool.flow-reconcile"
	ReconcileLockKey  = "leasepool.flow-reconcile"
	// DefaultReconcileEvery is how often the reconciler runs: the longest a
	// flow waits after a crash between its write and its next publish.
	DefaultReconcileEvery = 5 * time.Second
)

// Config wires flows into a worker.
type Config struct {
	Store  task.Store
	Logger *slog.Logger
	// ExecKind: see MiddlewareConfig.
	ExecKind string
}

// Register adds Middleware to mux and the reconciler's handler for
// ReconcileKind; the worker must also claim ReconcileKind
// (consumer.Config.Kinds) and run ReconcileTaskSchedule in its schedule
// runner.
func Register(mux *consumer.Mux, cfg Config) error {
	if cfg.Store == nil {
		return fmt.Errorf("flow: %w: store: required", task.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	mux.Use(Middleware(MiddlewareConfig(cfg)))
	mux.RegisterFunc(ReconcileKind, func(ctx context.Context, job *consumer.Job) error {
		st, err := Reconcile(ctx, cfg.Store, cfg.Logger)
		if st.Advanced+st.Published > 0 || err != nil {
			cfg.Logger.Info("flow reconcile", slog.Int("active", st.Active), slog.Int("advanced", st.Advanced),
				slog.Int("published", st.Published), slog.Any("err", err))
		}
		return err
	})
	return nil
}

// ReconcileTaskSchedule is the built-in schedule of the reconciler task,
// every period (DefaultReconcileEvery when zero); pass it in
// schedule.RunnerConfig.Builtin.
func ReconcileTaskSchedule(every time.Duration) schedule.Schedule {
	if every <= 0 {
		every = DefaultReconcileEvery
	}
	return schedule.Schedule{
		Name: ReconcileSchedule, Every: task.Duration(every), CatchUp: schedule.CatchUp{Mode: schedule.CatchUpLast},
		Template: schedule.Template{Kind: ReconcileKind, LockKeys: []string{ReconcileLockKey}, MaxUnexpectedRetries: task.NoRetries},
	}
}
