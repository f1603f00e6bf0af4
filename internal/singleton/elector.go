package singleton

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/leasepool/leasepool/task"
)

// An Elector is one lease for many duties: every process of the cluster
// runs one under the same Key, the one holding the lease (a Runner's) is
// elected, and the duties registered on it run there and nowhere else.
// Each duty starts when this process is elected and stops, its context
// cancelled and its return waited for, when the process loses the lease
// (taken over, or about to run out unrenewed) or gives it up (Stop).
// A dead or frozen holder is replaced within about a lease, a stopped one
// within Renew, as for a Runner: the guarantees are the Runner's, for all
// the duties together.
//
// One lease rather than one per duty: a cluster pays one renewal a
// period, a standby one look, and every duty has one holder, so that
// "which worker runs the maintenance" has one answer (Elected).
type Elector struct {
	runner *Runner
	log    *slog.Logger
	retry  time.Duration

	mu      sync.Mutex
	duties  []Duty
	started bool
	running map[string]bool // duties whose Run is running here
}

// Duty is work an Elector runs while elected.
type Duty struct {
	// Name says what the duty is, in logs. Required, one per Elector.
	Name string
	// Run does the duty until ctx ends, then returns promptly: the next
	// holder may start a tenth of a lease later. A Run that returns
	// while this process is still elected (an error) is logged and run
	// again after ElectorConfig.Retry; the other duties go on. Required.
	Run func(ctx context.Context) error
}

// ElectorConfig configures an Elector.
type ElectorConfig struct {
	// Store, Key, HolderID, Lease, Renew and Logger are the lease's, as in
	// Config.
	Store    Store
	Key      string
	HolderID string
	Lease    time.Duration
	Renew    time.Duration
	Logger   *slog.Logger
	// Retry is how long a duty that returned while elected waits before
	// it runs again. Zero means Renew.
	Retry time.Duration
}

// NewElector checks cfg and returns an Elector with no duties: Register
// them, then Start.
func NewElector(cfg ElectorConfig) (*Elector, error) {
	if cfg.Retry < 0 {
		return nil, fmt.Errorf("elector %s: %w: retry: %s is negative", cfg.Key, task.ErrInvalid, cfg.Retry)
	}
	e := &Elector{running: map[string]bool{}}
	r, err := New(Config{Store: cfg.Store, Key: cfg.Key, HolderID: cfg.HolderID, Lease: cfg.Lease, Renew: cfg.Renew,
		Logger: cfg.Logger, Run: e.run})
	if err != nil {
		return nil, fmt.Errorf("elector: %w", err)
	}
	e.runner, e.log = r, r.cfg.Logger.With(slog.String("elector", cfg.Key))
	e.retry = cfg.Retry
	if e.retry == 0 {
		e.retry = r.cfg.Renew
	}
	return e, nil
}

// Register adds a duty. Duties are registered before Start: afterwards
// Register returns an error wrapping task.ErrInvalid, as it does for a
// duty without a name or a Run, or under a name taken.
func (e *Elector) Register(d Duty) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.started:
		return fmt.Errorf("elector %s: %w: duty %q registered after Start", e.runner.cfg.Key, task.ErrInvalid, d.Name)
	case d.Name == "":
		return fmt.Errorf("elector %s: %w: duty name: required", e.runner.cfg.Key, task.ErrInvalid)
	case d.Run == nil:
		return fmt.Errorf("elector %s: %w: duty %q: run: required", e.runner.cfg.Key, task.ErrInvalid, d.Name)
	case slices.ContainsFunc(e.duties, func(o Duty) bool { return o.Name == d.Name }):
		return fmt.Errorf("elector %s: %w: duty %q registered twice", e.runner.cfg.Key, task.ErrInvalid, d.Name)
	}
	e.duties = append(e.duties, d)
	return nil
}

// Start starts standing for election; ctx bounds startup only (see
// Runner.Start). A second call returns lifecycle.ErrStarted.
func (e *Elector) Start(ctx context.Context) error {
	e.mu.Lock()
	e.started = true
	e.mu.Unlock()
	return e.runner.Start(ctx)
}

// Stop stops the duties if this process is elected, waits for them,
// releases the lease so a peer is elected within Renew, and stops
// standing. It returns when that is done or ctx ends; it may be called
// again.
func (e *Elector) Stop(ctx context.Context) error { return e.runner.Stop(ctx) }

// Abandon stops as Stop does but leaves the lease to run out, as a crash
// would: for tests of takeover.
func (e *Elector) Abandon(ctx context.Context) error { return e.runner.Abandon(ctx) }

// Elected reports whether this process is elected now: its duties run
// here, from the election until the last of them has returned after the
// lease was lost or given up. One process of the cluster at a time,
// except for the instant of a takeover across a pause (see the package
// documentation).
func (e *Elector) Elected() bool { return e.runner.Running() }

// Running reports whether the duty named name is running here now.
func (e *Elector) Running(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running[name]
}

// Holder is the lock holder this Elector writes when elected.
func (e *Elector) Holder() task.Holder { return e.runner.Holder() }

// Lease is the lease length in use.
func (e *Elector) Lease() time.Duration { return e.runner.Lease() }

// run is the Runner's work while elected: every duty, until ctx ends.
func (e *Elector) run(ctx context.Context) error {
	e.mu.Lock()
	duties := slices.Clone(e.duties)
	e.mu.Unlock()
	names := make([]string, len(duties))
	for i, d := range duties {
		names[i] = d.Name
	}
	e.log.Info("elected: duties started", slog.String("holder", e.runner.holder.WorkerID), slog.Any("duties", names))
	var wg sync.WaitGroup
	for _, d := range duties {
		wg.Go(func() { e.keep(ctx, d) })
	}
	// Elected until the lease is lost or given up, duties or none: a
	// return would give the lease up.
	<-ctx.Done()
	wg.Wait()
	e.log.Info("duties stopped", slog.Any("cause", context.Cause(ctx)))
	return nil
}

// keep runs d until ctx ends, again after e.retry whenever it returns
// before.
func (e *Elector) keep(ctx context.Context, d Duty) {
	for {
		e.setRunning(d.Name, true)
		err := d.Run(ctx)
		e.setRunning(d.Name, false)
		if ctx.Err() != nil {
			return
		}
		e.log.Warn("duty returned while elected: running it again", slog.String("duty", d.Name),
			slog.Duration("after", e.retry), slog.Any("error", err))
		t := time.NewTimer(e.retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (e *Elector) setRunning(name string, on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if on {
		e.running[name] = true
	} else {
		delete(e.running, name)
	}
}
