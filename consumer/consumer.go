// Package consumer is leasepool's worker pool. It finds work by watching the
// store's change stream and querying candidates (watch first, so nothing
// falls in the gap), keeps each claimable task's claim time in a bounded
// heap, claims due tasks by compare-and-set, runs handlers with a lease kept
// alive by package ping, and writes the outcome. It obeys the stored pauses
// and rate limits (package control). Stop drains gracefully and releases
// leases so peers take over at once.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/ping"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/consumer/internal/runtab"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/task"
)

// ErrShutdown is the cancellation cause handlers see when the worker stops.
var ErrShutdown = errors.New("worker shutting down")

// Stats are counters since Start.
type Stats struct {
	Running, Queued                       int
	Claimed, Succeeded, Failed, LeaseLost int64
	Released, Snoozed                     int64
}

// Consumer is one worker: it claims and runs tasks until stopped.
type Consumer struct {
	cfg       Config
	store     task.Store
	logger    *slog.Logger
	self      task.Holder // worker id and instance, as claims carry them
	startedAt time.Time

	regMu      sync.Mutex
	registered bool

	life           lifecycle.Runner // the scheduler, watch and heartbeat goroutines
	scheduleDone   chan struct{}
	handlerCtx     context.Context // parent of every handler's context
	cancelHandlers context.CancelCauseFunc
	runs           sync.WaitGroup // claim attempts and handler runs

	events  chan task.Event
	requery chan struct{}
	pollNow chan struct{}
	results chan attemptResult
	handled chan bool // a handler returned: true for an instant lane's slot

	// ctl is the pauses and rate limits as last loaded; controlChanged
	// tells the scheduler a load happened. slots is what this process
	// knows of the rate limits' slot locks.
	ctl            atomic.Pointer[control.State]
	controlChanged chan struct{}
	slots          slotTable
	rules          *claimRules // this worker's claims: see claim.go

	running *runtab.Table[*run]
	locks   *claimtab.Locks // the scheduler's, but for heirs read by attempts
	// sched is the scheduler Start made; the package's tests read its
	// claim table while the bubble they run in is still (synctest.Wait).
	sched *scheduler
	// peers is the live workers as the registry last listed them, for
	// claim spreading (see Config.ClaimSpread).
	peers atomic.Pointer[preempt.Peers]
	// peersSteady: the last two registry reads listed the same workers.
	peersSteady atomic.Bool
	// seen is what the heartbeat's last registry read said of this
	// worker's own registration (see Registration).
	seen atomic.Pointer[Registration]

	queued                                atomic.Int64
	claimed, succeeded, failed, leaseLost atomic.Int64
	released, snoozed                     atomic.Int64
}

type run struct {
	lease   *ping.Renewer
	seq     int64 // the claimed document's Seq and Version: see claimtab.Newer
	version int64
	cancel  context.CancelCauseFunc
}

// attemptResult tells the scheduler a slot is free and, when the task
// could not be claimed, when to try again.
type attemptResult struct {
	key   string
	retry *preempt.Entry
	// doc is the newest document of the task the attempt knows: the one
	// its claim decided on, or, once it ran, its last write (nil when a
	// store error or the task's deletion left none).
	doc      *task.Task
	lockKeys []string // waiting for these locks, held by another process
	ahead    string   // the task whose place in a lock's line stopped the claim
	busy     []string // the lock keys dispatch marked busy for this attempt
	wakes    []uint64 // busy's wake counts at dispatch (claimtab.Locks.depart)
	limited  bool     // retry waits for a rate limit's slot
	// slotFreed: the slot was given back when the handler returned.
	slotFreed bool
	instant   bool // the slot was the instant lane's (dispatch)
	// attempt is the claim table's number of the attempt; landed, that
	// its claim landed and it ran (the scheduler was sent a notice).
	attempt uint64
	landed  bool
}

// New validates cfg and returns a consumer ready to Start.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.checkAndFillDefaults(); err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg:            cfg,
		store:          cfg.Store,
		self:           task.Holder{WorkerID: cfg.WorkerID, Instance: newInstance()},
		logger:         cfg.Logger.With(slog.String("worker", cfg.WorkerID)),
		events:         make(chan task.Event, 1024),
		requery:        make(chan struct{}, 1),
		pollNow:        make(chan struct{}, 1),
		results:        make(chan attemptResult, cfg.Concurrency+InstantSlots),
		handled:        make(chan bool, cfg.Concurrency+InstantSlots),
		controlChanged: make(chan struct{}, 1),
		running:        runtab.New[*run](),
		locks:          claimtab.NewLocks(),
	}
	c.rules = &claimRules{
		store: c.store, self: c.self, controls: c.ctl.Load, slots: &c.slots,
		conflict: cfg.Observer.ClaimConflict, logger: c.logger,
	}
	return c, nil
}

// WorkerID is this worker's id.
func (c *Consumer) WorkerID() string { return c.cfg.WorkerID }

// Stats returns counters since Start.
func (c *Consumer) Stats() Stats {
	return Stats{
		Running: c.running.Len(), Queued: int(c.queued.Load()),
		Claimed: c.claimed.Load(), Succeeded: c.succeeded.Load(), Failed: c.failed.Load(),
		LeaseLost: c.leaseLost.Load(), Released: c.released.Load(), Snoozed: c.snoozed.Load(),
	}
}

// Start registers the worker and begins claiming and running tasks; it
// returns at once. It fails, wrapping task.ErrWorkerIDTaken, while another
// live process holds the worker id, and with lifecycle's ErrStarted or
// ErrStopped when called twice or after Stop. Beyond the shared start/stop
// contract, the consumer keeps one rule of its own: ctx ending is a hard
// stop (claiming stops, running handlers are cancelled and their leases
// released); Stop is the graceful way.
func (c *Consumer) Start(ctx context.Context) error {
	run, err := c.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", c.cfg.WorkerID, err)
	}
	if err := c.Register(ctx); err != nil {
		return err
	}
	c.handlerCtx, c.cancelHandlers = context.WithCancelCause(ctx)
	schedCtx, cancel := context.WithCancel(run) // ends at Stop
	context.AfterFunc(ctx, cancel)              // or when ctx does
	c.scheduleDone = make(chan struct{})
	c.sched = c.newScheduler()
	watchDone, beatDone := make(chan struct{}), make(chan struct{})
	c.life.Go(func() {
		defer close(watchDone)
		c.watch(schedCtx)
	})
	c.life.Go(func() {
		defer close(beatDone)
		c.heartbeat(schedCtx)
	})
	c.life.Go(func() {
		defer close(c.scheduleDone)
		c.sched.run(schedCtx, scheduleInputs{events: c.events, requery: c.requery, pollNow: c.pollNow, control: c.controlChanged})
		<-watchDone
		<-beatDone
	})
	c.logger.Info("worker started", slog.Int("concurrency", c.cfg.Concurrency), slog.Any("kinds", c.cfg.Kinds))
	return nil
}

// Stop stops claiming, lets running handlers finish until ShutdownTimeout
// or ctx's deadline, then cancels them with ErrShutdown and releases their
// leases so peers claim at once. It returns when every goroutine has
// exited, even past ctx's end (the handlers are cancelled then); calling
// it again waits for the same end.
func (c *Consumer) Stop(ctx context.Context) error {
	err := c.life.Stop(context.WithoutCancel(ctx), func() { c.drain(ctx) })
	c.unregister() // Register without Start, or a Start that failed
	return err
}

// drain runs once the scheduler, watch and heartbeat have stopped: no new
// claims. It gives running handlers their grace period, cancels the rest
// (each releases its lease before returning) and frees the worker id.
func (c *Consumer) drain(ctx context.Context) {
	if c.cancelHandlers == nil { // Start failed to register
		return
	}
	drained := make(chan struct{})
	go func() { c.runs.Wait(); close(drained) }()
	grace := time.NewTimer(c.cfg.ShutdownTimeout)
	defer grace.Stop()
	select {
	case <-drained:
	case <-grace.C:
	case <-ctx.Done():
	}
	c.cancelHandlers(ErrShutdown)
	<-drained
	c.unregister()
	c.logger.Info("worker stopped", slog.Int64("succeeded", c.succeeded.Load()), slog.Int64("failed", c.failed.Load()))
}
