package schedule

// The Runner: each poll it reads the schedules and their cursors from the
// store and publishes the slots that are due. In package worker it is a
// duty of the elected worker (Runner.Duty), so added workers add no reads
// and no racing publishes, and another worker is elected within a lease
// well inside Late. Started alone with a HolderID, the runners of a
// cluster elect one (internal/singleton) on LockKey, with a lease of
// three polls; without one a runner polls on its own. Either way a slot
// published twice (a holder paused past its lease, beside the next) is
// one task: task.Publish keeps one task per key, and the cursor only
// moves forward.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/task"
)

// Runner defaults.
const (
	// DefaultPoll is how often a runner reads the schedules: a change (add,
	// pause, resume, rm) takes effect within about this long.
	DefaultPoll = time.Second
	// DefaultLate is how overdue a slot may be and still be published as
	// on time; later it counts as missed (catch-up). It covers a poll, a
	// slow store and a worker restart, but not an outage.
	DefaultLate = 10 * time.Second
	// DefaultMaxPerTick bounds the slots one schedule publishes per poll.
	DefaultMaxPerTick = 100
	// LockKey is the lease, in task.LockSingleton, of the runner that
	// polls when runners have a HolderID.
	LockKey = "leasepool.schedule-runner"
)

// RunnerConfig configures a Runner. Zero values take the defaults.
type RunnerConfig struct {
	Store task.Store
	// Poll is the period between passes (DefaultPoll).
	Poll time.Duration
	// Lead publishes a slot up to this long before it falls due, as a task
	// claimable at the slot (default Poll), so it starts on time.
	Lead time.Duration
	// Late: see DefaultLate.
	Late time.Duration
	// MaxPerTick: see DefaultMaxPerTick.
	MaxPerTick int
	// HolderID names this process (its worker id) in the election of the
	// one runner that polls; empty, this runner polls on its own.
	HolderID string
	Logger   *slog.Logger
}

// Runner publishes the due slots of every schedule. Start it once; Stop
// ends its goroutine.
type Runner struct {
	cfg RunnerConfig
	log *slog.Logger

	life lifecycle.Runner
	// elected runs the polls while this process holds LockKey (HolderID
	// set); nil when the runner polls on its own.
	elected *singleton.Runner
}

// NewRunner checks cfg and returns a Runner that has not started.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("schedule runner: %w: store: required", task.ErrInvalid)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Lead <= 0 {
		cfg.Lead = cfg.Poll
	}
	if cfg.Late <= 0 {
		cfg.Late = DefaultLate
	}
	if cfg.MaxPerTick <= 0 {
		cfg.MaxPerTick = DefaultMaxPerTick
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runner{cfg: cfg, log: cfg.Logger.With(slog.String("component", "schedule"))}
	if cfg.HolderID != "" {
		elected, err := singleton.New(singleton.Config{
			Store: cfg.Store, Key: LockKey, HolderID: cfg.HolderID,
			Lease: max(3*cfg.Poll, singleton.MinLease), Renew: cfg.Poll,
			Run: func(ctx context.Context) error { r.run(ctx); return nil }, Logger: r.log,
		})
		if err != nil {
			return nil, fmt.Errorf("schedule runner: %w", err)
		}
		r.elected = elected
	}
	return r, nil
}

// Start starts the runner's goroutine; it runs until Stop, whatever
// happens to ctx (its values are kept). A second Start is
// lifecycle.ErrStarted, a Start after Stop lifecycle.ErrStopped.
func (r *Runner) Start(ctx context.Context) error {
	if r.elected != nil {
		if err := r.elected.Start(ctx); err != nil {
			return fmt.Errorf("schedule runner: %w", err)
		}
		return nil
	}
	run, err := r.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("schedule runner: %w", err)
	}
	r.life.Go(func() { r.run(run) })
	return nil
}

// Stop ends the runner and waits for its goroutine, or until ctx ends.
// Nothing is left half-done that another runner would not finish: a slot
// published without its cursor is published again as the same task.
func (r *Runner) Stop(ctx context.Context) error {
	if r.elected != nil {
		return r.elected.Stop(ctx)
	}
	return r.life.Stop(ctx, nil)
}

// Duty polls until ctx ends, with no election of its own: the duty an
// elector runs while its process is elected (package worker registers it
// on the worker's one elector). Run a Runner by Start or by Duty, not
// both.
func (r *Runner) Duty(ctx context.Context) error {
	r.run(ctx)
	return nil
}

func (r *Runner) run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Poll)
	defer t.Stop()
	for {
		if err := r.tick(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("schedules: pass failed; trying again next poll", slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick is one pass: publish every due slot of every active schedule.
func (r *Runner) tick(ctx context.Context) error {
	schs, err := loadAll(ctx, r.cfg.Store)
	if err != nil {
		return err
	}
	cursors, err := loadCursors(ctx, r.cfg.Store)
	if err != nil {
		return err
	}
	var errs []error
	for _, sch := range schs {
		if sch.Paused {
			continue
		}
		if err := r.publishDue(ctx, sch, cursors[sch.Name]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// publishDue publishes sch's due slots in order, then moves its cursor to
// the last one. A failure leaves the cursor at the last slot published.
func (r *Runner) publishDue(ctx context.Context, sch *Schedule, cur time.Time) error {
	slots, err := sch.Due(Window{Cursor: cur, Now: r.cfg.Store.Now(), Lead: r.cfg.Lead, Late: r.cfg.Late, Max: r.cfg.MaxPerTick})
	if err != nil {
		return fmt.Errorf("schedule %s: %w", sch.Name, err)
	}
	var last time.Time
	var pubErr error
	for _, slot := range slots {
		t, res, err := task.Publish(ctx, r.cfg.Store, sch.Template.Params(sch.Name, slot))
		if err != nil {
			pubErr = fmt.Errorf("schedule %s: slot %s: %w", sch.Name, slot.Format(time.RFC3339), err)
			break
		}
		if res == task.Inserted {
			r.log.Debug("schedules: published", slog.String("schedule", sch.Name), slog.String("key", t.Key))
		}
		last = slot
	}
	if last.IsZero() {
		return pubErr
	}
	if err := advance(ctx, r.cfg.Store, sch.Name, last); err != nil {
		return errors.Join(pubErr, fmt.Errorf("schedule %s: cursor: %w", sch.Name, err))
	}
	return pubErr
}
