// Package singleton runs one function at a time across every process that
// shares a store: one holder in the cluster, taken over within a lease.
//
// Every process runs a Runner under the same Key. The one that holds the
// key's lease in the store's lock table (in task.LockSingleton, apart from
// tasks' lock keys) runs Config.Run and renews the
// lease every Renew; the others try again when the holder's lease ends
// (they sleep until then, at most Renew at a time), so a holder that dies
// is replaced within about one Lease, and one that stops releases the
// lease, so a peer takes over within Renew.
//
// Never two at once: the context given to Run ends when the lease, less a
// tenth, runs out in store time without a renewal (a hung store, a
// process paused past its lease), or at once when the store says another
// holder took it. The lease is granted to another holder only after it has
// ended, so a Run that returns promptly when its context ends has returned
// before the next one starts. The check that ends the context runs on a
// timer of its own, not on the renewal loop, so a store call that hangs
// cannot delay it. A process paused past its lease ends Run when it wakes,
// and may work for that instant beside the new holder: Run's writes must
// tolerate that (compare-and-set, conditional deletes).
//
// An Elector is a Runner whose work is several duties: a worker process
// stands for election once, and the one elected runs the schedule
// runner, the flow reconciler, the rollout driver and retention (package
// worker registers them). The embedded MQTT broker's host runs on a
// Runner of its own (docs/decisions/0015-one-elector-and-a-broker-lease.md).
package singleton

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/task"
)

// Store is the part of task.Store a Runner uses: the lock table and the
// store's clock. Every task.Store is one.
type Store interface {
	AcquireLocks(ctx context.Context, p task.LockParams) error
	ReleaseLocks(ctx context.Context, p task.LockParams) error
	Now() time.Time
}

// lockReader is a Store that reads a lease's holder in one round trip,
// shared by the calls of one process that ask for a read sent at or after
// the same instant (mongostore.Store). A process that last found the
// lease held by another looks with it before it tries to take it: while
// the lease stays held a look costs at most that one read, where
// AcquireLocks, failing, costs its take and then a read saying by whom.
// Looks come at least every Renew, as tries did, so takeovers come as
// soon.
type lockReader interface {
	LockHolder(ctx context.Context, ns task.LockNamespace, key string, since time.Time) (task.Holder, time.Time, error)
}

// gridPhase places the instants at which this process's Runners standing
// by look at their leases: phase + k*Renew on the local clock. Runners of
// one process whose Renew periods divide each other (1 s, 5 s) look at
// the same instants and share one read; processes, each with a phase of
// its own, do not look all at once.
var gridPhase = time.Duration(mrand.Int64N(int64(time.Second)))

// nextLook is the first instant on this process's grid of period renew
// after now (local clock).
func nextLook(now time.Time, renew time.Duration) time.Time {
	n := now.UnixNano() - int64(gridPhase)
	return time.Unix(0, n-n%int64(renew)+int64(renew)+int64(gridPhase))
}

// Defaults and bounds.
const (
	// DefaultLease is how long the lease lasts without renewal unless
	// configured.
	DefaultLease = 15 * time.Second
	// MinLease is the shortest lease accepted: below it a renewal's round
	// trip and the scheduler's delays eat the margin.
	MinLease = 100 * time.Millisecond
)

// Config configures a Runner.
type Config struct {
	// Store holds the lease in its lock table. Required.
	Store Store
	// Key is the lock key, in task.LockSingleton, every process of the
	// group uses. Required.
	Key string
	// HolderID names this process in the lock table (its worker id), next
	// to a random instance id made per Runner, so two processes under one
	// id never renew each other's lease. Required.
	HolderID string
	// Lease is how long the lease lasts without renewal: a dead holder is
	// replaced within about this long. Zero means DefaultLease; at least
	// MinLease.
	Lease time.Duration
	// Renew is how often the holder renews the lease, and the longest a
	// waiting process sleeps between tries. Zero means Lease/3; at most
	// Lease/2, so a renewal that fails is tried again before the lease
	// runs out.
	Renew time.Duration
	// Run is the work of the holder. Its context ends when the lease is
	// lost or the Runner stops, and Run must then return promptly: the
	// next holder may start a tenth of a lease later. When Run returns
	// while the lease is held (an error, or nothing left to do), the lease
	// is released and this process tries again after Renew. Required.
	Run func(ctx context.Context) error
	// Logger gets elections, losses and Run's errors; nil discards.
	Logger *slog.Logger
}

func (c *Config) validate() error {
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: store: required", task.ErrInvalid)
	case c.Key == "":
		return fmt.Errorf("%w: key: required", task.ErrInvalid)
	case c.HolderID == "":
		return fmt.Errorf("%w: holder id: required", task.ErrInvalid)
	case c.Run == nil:
		return fmt.Errorf("%w: run: required", task.ErrInvalid)
	case c.Lease < 0:
		return fmt.Errorf("%w: lease: %s is negative", task.ErrInvalid, c.Lease)
	case c.Renew < 0:
		return fmt.Errorf("%w: renew: %s is negative", task.ErrInvalid, c.Renew)
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Lease < MinLease {
		return fmt.Errorf("%w: lease: %s is below %s", task.ErrInvalid, c.Lease, MinLease)
	}
	if c.Renew == 0 {
		c.Renew = c.Lease / 3
	}
	if c.Renew > c.Lease/2 {
		return fmt.Errorf("%w: renew: %s is more than half the lease (%s)", task.ErrInvalid, c.Renew, c.Lease)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Runner keeps Config.Run running in exactly one process of those sharing
// a store and a Key. Start and Stop follow internal/lifecycle.
type Runner struct {
	cfg    Config
	holder task.Holder
	margin time.Duration
	life   lifecycle.Runner

	mu      sync.Mutex
	running bool // Run is running here
	abandon bool // on stop, leave the lease to run out
}

// New checks cfg and returns a Runner; Start runs it.
func New(cfg Config) (*Runner, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("singleton %s: %w", cfg.Key, err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &Runner{
		cfg:    cfg,
		holder: task.Holder{TaskKey: cfg.Key, WorkerID: cfg.HolderID, Instance: hex.EncodeToString(b)},
		margin: cfg.Lease / 10,
	}, nil
}

// Holder is the lock holder this Runner writes when it holds the lease.
func (r *Runner) Holder() task.Holder { return r.holder }

// Lease is the lease length in use (Config.Lease with its default filled).
func (r *Runner) Lease() time.Duration { return r.cfg.Lease }

// Running reports whether Run is running in this process now.
func (r *Runner) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Start starts the supervisor goroutine and returns at once. ctx's values
// are kept, its cancellation is not (it bounds startup only). A second
// call returns lifecycle.ErrStarted.
func (r *Runner) Start(ctx context.Context) error {
	run, err := r.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("singleton %s: %w", r.cfg.Key, err)
	}
	r.life.Go(func() { r.supervise(run) })
	return nil
}

// Stop ends Run's context, waits for Run to return, releases the lease so
// a peer takes over within its Renew, and ends the supervisor. It returns
// when that is done or ctx ends; it may be called again.
func (r *Runner) Stop(ctx context.Context) error { return r.life.Stop(ctx, nil) }

// Abandon stops as Stop does but leaves the lease to run out, as a crash
// would: for tests of takeover.
func (r *Runner) Abandon(ctx context.Context) error {
	r.mu.Lock()
	r.abandon = true
	r.mu.Unlock()
	return r.life.Stop(ctx, nil)
}

// errLeaseEnding ends Run's context when the lease is about to run out
// without a renewal; errLeaseTaken when the store names another holder.
var (
	errLeaseEnding = errors.New("singleton lease about to run out unrenewed")
	errLeaseTaken  = errors.New("singleton lease taken by another holder")
	errStopping    = errors.New("singleton runner stopping")
)

// term is one run of Config.Run under one holding of the lease.
type term struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	expire *time.Timer // ends ctx at the lease's end, less the margin
	done   chan struct{}
	err    error // Run's, set before done is closed
}

func (r *Runner) startTerm(parent context.Context, left time.Duration) *term {
	ctx, cancel := context.WithCancelCause(parent)
	t := &term{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	t.expire = time.AfterFunc(left, func() { cancel(errLeaseEnding) })
	r.mu.Lock()
	r.running = true
	r.mu.Unlock()
	go func() {
		defer close(t.done)
		defer func() {
			r.mu.Lock()
			r.running = false
			r.mu.Unlock()
		}()
		t.err = r.cfg.Run(ctx)
	}()
	return t
}

// end cancels the term with cause and waits for Run to return.
func (t *term) end(cause error) {
	if t == nil {
		return
	}
	t.expire.Stop()
	t.cancel(cause)
	<-t.done
}

// supervise takes or renews the lease, runs a term while it is held, and
// ends the term when it is lost.
func (r *Runner) supervise(ctx context.Context) {
	log := r.cfg.Logger.With(slog.String("singleton", r.cfg.Key))
	var (
		heldUntil time.Time // store time; zero: not held
		cur       *term
		// othersUntil is the end of another holder's lease as this
		// process last found it; zero when it did not.
		othersUntil time.Time
		// lookAt is when, on the local clock, the timer was set to wake
		// this process to look at another's lease; a read sent since
		// answers that look.
		lookAt time.Time
	)
	reader, _ := r.cfg.Store.(lockReader)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		var ended <-chan struct{}
		if cur != nil {
			ended = cur.done
		}
		select {
		case <-ctx.Done():
			cur.end(errStopping)
			r.release(log, heldUntil)
			return
		case <-ended:
			cause := context.Cause(cur.ctx)
			runErr := cur.err
			cur.expire.Stop()
			cur = nil
			if ctx.Err() != nil {
				continue // stopping: the next pass releases
			}
			if errors.Is(cause, errLeaseEnding) {
				// The lease may have been renewed since the timer fired;
				// the next try finds out.
				log.Warn("singleton lease not renewed in time: its work stopped")
				heldUntil = time.Time{}
				timer.Reset(0)
				continue
			}
			log.Warn("singleton work returned while holding the lease: releasing it", slog.Any("error", runErr))
			r.release(log, heldUntil)
			heldUntil = time.Time{}
			timer.Reset(r.cfg.Renew)
			continue
		case <-timer.C:
		}

		now := r.cfg.Store.Now()
		held := !heldUntil.IsZero()
		// A renewal that has not landed before the lease, less the margin,
		// runs out is given up; a first try gets one renewal period.
		limit := r.cfg.Renew
		if held {
			limit = heldUntil.Add(-r.margin).Sub(now)
		}
		if limit <= 0 {
			// Too late to renew (this process was paused, or the term's
			// work is slow to return): try to take it afresh.
			held, heldUntil, limit = false, time.Time{}, r.cfg.Renew
		}
		if !held && cur == nil && !othersUntil.IsZero() && reader != nil {
			since := lookAt
			if since.IsZero() {
				since = time.Now()
			}
			if until, ok := r.stillHeld(ctx, reader, now, since, limit); ok {
				lookAt = r.lookAgain(timer, now, until)
				continue
			}
			othersUntil = time.Time{}
		}
		until := now.Add(r.cfg.Lease)
		// Stop lets a take or renewal in flight finish (for up to Renew):
		// one given up may still land after the release Stop then sends,
		// and hold the lease a whole Lease longer with no one running.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(limit, time.Millisecond))
		stopping := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.Renew, cancel) })
		err := r.cfg.Store.AcquireLocks(actx, task.LockParams{Namespace: task.LockSingleton, Keys: []string{r.cfg.Key}, Holder: r.holder, Now: now, Until: until})
		stopping()
		cancel()
		var locked *task.LockedError
		switch {
		case err == nil:
			if !held {
				log.Info("singleton lease taken", slog.String("holder", r.holder.WorkerID))
			} else {
				log.Debug("singleton lease renewed", slog.Time("until", until), slog.Duration("took", r.cfg.Store.Now().Sub(now)))
			}
			heldUntil = until
			left := heldUntil.Add(-r.margin).Sub(r.cfg.Store.Now())
			if cur == nil {
				cur = r.startTerm(ctx, left)
			} else if !cur.expire.Reset(left) {
				// Fired meanwhile: this term ends; the next begins once Run
				// has returned.
				cur.expire.Stop()
			}
			timer.Reset(max(now.Add(r.cfg.Renew).Sub(r.cfg.Store.Now()), 0))
		case ctx.Err() != nil:
			// Stopping: the next pass ends the term.
		case errors.As(err, &locked):
			if held || cur != nil {
				log.Warn("singleton lease lost to another holder: stopping its work",
					slog.String("holder", locked.Holder.WorkerID))
			}
			cur.end(errLeaseTaken)
			cur = nil
			heldUntil = time.Time{}
			othersUntil = locked.Until
			lookAt = r.lookAgain(timer, now, locked.Until)
		default:
			log.Warn("singleton lease not taken or renewed", slog.Any("error", err))
			// Held, the term goes on until its timer says the lease is
			// running out; try again soon.
			timer.Reset(min(r.cfg.Renew, 250*time.Millisecond))
		}
	}
}

// lookAgain sets timer to wake a process that found the lease held by
// another until then (store time, now being the store's): when the lease
// ends, or sooner, at the next instant of this process's grid (Renew at
// most), in case the holder releases it. It returns when, on the local
// clock, the timer fires.
func (r *Runner) lookAgain(timer *time.Timer, now, until time.Time) time.Time {
	local := time.Now()
	wait := min(max(until.Sub(now)+10*time.Millisecond, 10*time.Millisecond), nextLook(local, r.cfg.Renew).Sub(local))
	timer.Reset(wait)
	return local.Add(wait)
}

// stillHeld reads the lease's holder, from a read sent at or after since,
// and returns the end of another holder's lease still running; false when
// it is free, lapsed, this Runner's own or the read failed: then take it.
func (r *Runner) stillHeld(ctx context.Context, reader lockReader, now, since time.Time, limit time.Duration) (time.Time, bool) {
	rctx, cancel := context.WithTimeout(ctx, max(limit, time.Millisecond))
	defer cancel()
	h, until, err := reader.LockHolder(rctx, task.LockSingleton, r.cfg.Key, since)
	if err != nil || h == r.holder || !until.After(now) {
		return time.Time{}, false
	}
	return until, true
}

// release gives the lease up (unless abandoned) so that a peer need not
// wait for it to run out.
func (r *Runner) release(log *slog.Logger, heldUntil time.Time) {
	r.mu.Lock()
	abandon := r.abandon
	r.mu.Unlock()
	if heldUntil.IsZero() || abandon {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(r.cfg.Renew, time.Second))
	defer cancel()
	if err := r.cfg.Store.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: []string{r.cfg.Key}, Holder: r.holder}); err != nil {
		log.Warn("singleton lease not released", slog.Any("error", err))
	}
}
