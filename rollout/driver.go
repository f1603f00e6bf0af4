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

// Driver keeps rollouts moving, in one process at a time: in package
// worker as a duty of the elected worker (Duty); started alone, every
// process runs one and the one holding the lease on LockKey steps every
// active rollout every Every, another taking over within a lease after
// it dies (internal/singleton).
// While no rollout is active the holder only looks for one, every
// IdleEvery: an idle cluster pays one read of the rollouts per IdleEvery,
// and a rollout created starts within about that long.
type Driver struct {
	cfg     DriverConfig
	stepper *Stepper
	runner  *singleton.Runner
	// over are the versions of the rollouts seen over (Pass only);
	// refused those of the rollouts whose step the store refused (a
	// document it will not take): neither is stepped again until its
	// document changes, so a refusal is logged once, not every step.
	over, refused map[string]int64
}

// LockKey is the driver's singleton lease in the lock table.
const LockKey = "leasepool.rollout-driver"

// Defaults of DriverConfig.
const (
	DefaultEvery     = 200 * time.Millisecond
	DefaultIdleEvery = time.Second
	DefaultLease     = 3 * time.Second
)

// DriverConfig configures a Driver.
type DriverConfig struct {
	Store Store
	// WorkerID names the holder in the lock table (the worker's id).
	WorkerID string
	// Every is how often the holder steps each active rollout
	// (DefaultEvery).
	Every time.Duration
	// IdleEvery is how often the holder looks for a rollout to step
	// while none is active (none created, or every one over):
	// DefaultIdleEvery, and at least Every. A rollout created, or
	// retried once over, waits up to this long for its first step.
	IdleEvery time.Duration
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
	switch {
	case cfg.IdleEvery < 0:
		return nil, fmt.Errorf("rollout driver: %w: idle every: %s is negative", task.ErrInvalid, cfg.IdleEvery)
	case cfg.IdleEvery == 0:
		cfg.IdleEvery = max(DefaultIdleEvery, cfg.Every)
	case cfg.IdleEvery < cfg.Every:
		return nil, fmt.Errorf("rollout driver: %w: idle every: %s is shorter than every (%s)", task.ErrInvalid, cfg.IdleEvery, cfg.Every)
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Driver{cfg: cfg, stepper: NewStepper(cfg.Store), over: map[string]int64{}, refused: map[string]int64{}}
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

// Duty steps the rollouts until ctx ends, with no lease of its own: the
// duty an elector runs while its process is elected (package worker
// registers it on the worker's one elector). Run a Driver by Start or by
// Duty, not both.
func (d *Driver) Duty(ctx context.Context) error { return d.loop(ctx) }

func (d *Driver) loop(ctx context.Context) error {
	// A new holder starts from what the document says: keys another
	// holder recorded are its to dispatch again, not to publish.
	d.stepper = NewStepper(d.cfg.Store)
	feedCtx, stopFeed := context.WithCancel(ctx)
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		d.stepper.Follow(feedCtx)
	}()
	defer func() {
		stopFeed()
		<-fed
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	active := false
	for {
		start := time.Now()
		busy, err := d.pass(ctx)
		switch {
		case err == nil:
			active = busy
		case ctx.Err() == nil:
			// A failed listing says nothing new: keep the pace.
			active = active || busy
			d.cfg.Logger.Warn("rollout driver", slog.Any("error", err))
		}
		wait := d.cfg.IdleEvery
		if active {
			wait = d.cfg.Every
		}
		timer.Reset(time.Until(start.Add(wait)))
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
	}
}

// Pass steps every rollout that is not over once. A rollout seen over
// is not decoded again until its document changes (retry-failed).
func (d *Driver) Pass(ctx context.Context) error {
	_, err := d.pass(ctx)
	return err
}

// pass is Pass, also reporting whether it stepped a rollout.
func (d *Driver) pass(ctx context.Context) (active bool, err error) {
	docs, err := d.cfg.Store.Documents(ctx, Namespace)
	if err != nil {
		return false, err
	}
	var errs []error
	seen := make(map[string]bool, len(docs))
	for _, doc := range docs {
		seen[doc.ID] = true
		if v, ok := d.over[doc.ID]; ok && v == doc.Version {
			continue
		}
		if v, ok := d.refused[doc.ID]; ok && v == doc.Version {
			continue
		}
		delete(d.refused, doc.ID)
		r, err := decode(doc)
		if err != nil {
			task.SkipMalformed(Namespace, doc.ID, err)
			continue
		}
		if r.Over() {
			d.over[doc.ID] = doc.Version
			continue
		}
		delete(d.over, doc.ID)
		active = true
		err = d.stepper.Step(ctx, r.Name)
		switch {
		case err == nil, errors.Is(err, task.ErrConflict):
		case errors.Is(err, task.ErrInvalid):
			d.refused[doc.ID] = doc.Version
			errs = append(errs, fmt.Errorf("%w (not stepped again until it changes)", err))
		default:
			errs = append(errs, err)
		}
	}
	for id := range d.over {
		if !seen[id] {
			delete(d.over, id) // deleted
		}
	}
	for id := range d.refused {
		if !seen[id] {
			delete(d.refused, id)
		}
	}
	return active, errors.Join(errs...)
}
