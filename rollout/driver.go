package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/task"
)

// Driver keeps rollouts moving. Every worker runs one; the one holding
// the lease on LockKey steps every active rollout every period, and
// another takes over within a lease after it dies (internal/singleton).
type Driver struct {
	cfg     DriverConfig
	stepper *Stepper
	runner  *singleton.Runner
	// over are the versions of the rollouts seen over (Pass only).
	over map[string]int64
}

// LockKey is the driver's singleton lease in the lock table.
const LockKey = "leasepool.rollout-driver"

// Defaults of DriverConfig.
const (
	DefaultEvery = 200 * time.Millisecond
	DefaultLease = 3 * time.Second
)

// DriverConfig configures a Driver.
type DriverConfig struct {
	Store Store
	// WorkerID names the holder in the lock table (the worker's id).
	WorkerID string
	// Every is how often the holder steps each active rollout
	// (DefaultEvery).
	Every time.Duration
	// Lease is the singleton lease (DefaultLease): a dead driver is
	// replaced within about this long.
	Lease  time.Duration
	Logger *slog.Logger
}

// NewDriver checks cfg.
func NewDriver(cfg DriverConfig) (*Driver, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("rollout driver: %w: store: required", task.ErrInvalid)
	}
	if err := task.ValidateName("worker id", cfg.WorkerID); err != nil {
		return nil, fmt.Errorf("rollout driver: %w", err)
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Driver{cfg: cfg, stepper: NewStepper(cfg.Store), over: map[string]int64{}}
	runner, err := singleton.New(singleton.Config{
		Store: cfg.Store, Key: LockKey, HolderID: cfg.WorkerID,
		Lease: max(cfg.Lease, singleton.MinLease),
		Run:   d.loop, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("rollout driver: %w", err)
	}
	d.runner = runner
	return d, nil
}

// Start starts the driver; ctx bounds startup only.
func (d *Driver) Start(ctx context.Context) error { return d.runner.Start(ctx) }

// Stop ends the loop and gives the lease up.
func (d *Driver) Stop(ctx context.Context) error { return d.runner.Stop(ctx) }

func (d *Driver) loop(ctx context.Context) error {
	// A new holder starts from what the document says: keys another
	// holder recorded are its to dispatch again, not to publish.
	d.stepper = NewStepper(d.cfg.Store)
	t := time.NewTicker(d.cfg.Every)
	defer t.Stop()
	for {
		if err := d.Pass(ctx); err != nil && ctx.Err() == nil {
			d.cfg.Logger.Warn("rollout driver", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Pass steps every rollout that is not over once. A rollout seen over
// is not decoded again until its document changes (retry-failed).
func (d *Driver) Pass(ctx context.Context) error {
	docs, err := d.cfg.Store.Documents(ctx, Namespace)
	if err != nil {
		return err
	}
	var errs []error
	for _, doc := range docs {
		if v, ok := d.over[doc.ID]; ok && v == doc.Version {
			continue
		}
		r, err := decode(doc)
		if err != nil {
			task.SkipMalformed(Namespace, doc.ID, err)
			continue
		}
		if r.State.Final() && (r.Rollback == nil || !r.Rollback.EndedAt.IsZero()) {
			d.over[doc.ID] = doc.Version
			continue
		}
		delete(d.over, doc.ID)
		if err := d.stepper.Step(ctx, r.Name); err != nil && !errors.Is(err, task.ErrConflict) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
