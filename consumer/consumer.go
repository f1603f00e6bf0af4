// Package consumer is leasepool's worker pool. It finds work by watching the
// store's change stream and querying candidates (watch first, so nothing
// falls in the gap), keeps each claimable task's claim time in a bounded
// heap, claims due tasks by compare-and-set, runs handlers with a lease kept
// alive by package ping, and writes the outcome. Stop drains gracefully and
// releases leases so peers take over at once.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/ping"
	"github.com/leasepool/leasepool/preempt"
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

	startOnce, stopOnce sync.Once
	stopSchedule        context.CancelFunc
	scheduleDone        chan struct{}
	handlerCtx          context.Context // parent of every handler's context
	cancelHandlers      context.CancelCauseFunc
	runs                sync.WaitGroup // claim attempts and handler runs

	events  chan task.Event
	requery chan struct{}
	pollNow chan struct{}
	results chan attemptResult

	mu      sync.Mutex
	running map[string]*run

	queued                                atomic.Int64
	claimed, succeeded, failed, leaseLost atomic.Int64
	released, snoozed                     atomic.Int64
}

type run struct {
	lease   *ping.Lease
	version int64 // document version written by the claim
	cancel  context.CancelCauseFunc
}

// attemptResult tells the scheduler a slot is free and, when the task
// could not be claimed, when to try again.
type attemptResult struct {
	key      string
	retry    *preempt.Entry
	lockKeys []string // waiting for these locks, held by another process
	busy     []string // the lock keys dispatch marked busy for this attempt
}

// New validates cfg and returns a consumer ready to Start.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Consumer{
		cfg:     cfg,
		store:   cfg.Store,
		self:    task.Holder{WorkerID: cfg.WorkerID, Instance: newInstance()},
		logger:  cfg.Logger.With(slog.String("worker", cfg.WorkerID)),
		events:  make(chan task.Event, 1024),
		requery: make(chan struct{}, 1),
		pollNow: make(chan struct{}, 1),
		results: make(chan attemptResult, cfg.Concurrency),
		running: make(map[string]*run),
	}, nil
}

// WorkerID is this worker's id.
func (c *Consumer) WorkerID() string { return c.cfg.WorkerID }

// Stats returns counters since Start.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	n := len(c.running)
	c.mu.Unlock()
	return Stats{
		Running: n, Queued: int(c.queued.Load()),
		Claimed: c.claimed.Load(), Succeeded: c.succeeded.Load(), Failed: c.failed.Load(),
		LeaseLost: c.leaseLost.Load(), Released: c.released.Load(), Snoozed: c.snoozed.Load(),
	}
}

// Start registers the worker and begins claiming and running tasks; it
// returns at once. It fails, wrapping task.ErrWorkerIDTaken, while another
// live process holds the worker id. Cancelling ctx stops claiming and
// cancels running handlers (their leases are released); Stop is the
// graceful way.
func (c *Consumer) Start(ctx context.Context) error {
	started := false
	var err error
	c.startOnce.Do(func() {
		started = true
		if err = c.Register(ctx); err != nil {
			return
		}
		c.handlerCtx, c.cancelHandlers = context.WithCancelCause(ctx)
		schedCtx, cancel := context.WithCancel(ctx)
		c.stopSchedule = cancel
		c.scheduleDone = make(chan struct{})
		watchDone, beatDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watchDone)
			c.watch(schedCtx)
		}()
		go func() {
			defer close(beatDone)
			c.heartbeat(schedCtx)
		}()
		go func() {
			defer close(c.scheduleDone)
			c.schedule(schedCtx)
			<-watchDone
			<-beatDone
		}()
		c.logger.Info("worker started", slog.Int("concurrency", c.cfg.Concurrency), slog.Any("kinds", c.cfg.Kinds))
	})
	if !started {
		return errors.New("consumer already started")
	}
	return err
}

// Stop stops claiming, lets running handlers finish until ShutdownTimeout
// or ctx's deadline, then cancels them with ErrShutdown and releases their
// leases so peers claim at once. It returns when every goroutine has
// exited; calling it again is harmless.
func (c *Consumer) Stop(ctx context.Context) error {
	if c.stopSchedule == nil {
		c.regMu.Lock()
		registered := c.registered
		c.regMu.Unlock()
		if registered { // Register without Start
			c.stopOnce.Do(c.unregister)
		}
		return nil
	}
	c.stopOnce.Do(func() {
		// 1. No new claims: stop the scheduler and the change stream.
		c.stopSchedule()
		<-c.scheduleDone
		// 2. Give running handlers their grace period.
		drained := make(chan struct{})
		go func() { c.runs.Wait(); close(drained) }()
		grace := time.NewTimer(c.cfg.ShutdownTimeout)
		defer grace.Stop()
		select {
		case <-drained:
		case <-grace.C:
		case <-ctx.Done():
		}
		// 3. Cancel the rest; each releases its lease before returning.
		c.cancelHandlers(ErrShutdown)
		<-drained
		// 4. Nothing runs here any more: free the worker id.
		c.unregister()
		c.logger.Info("worker stopped", slog.Int64("succeeded", c.succeeded.Load()), slog.Int64("failed", c.failed.Load()))
	})
	return nil
}

// watch feeds change events to the scheduler. It opens the stream before
// asking for a query, so nothing written between the two is missed, and
// reopens from the resume token after errors.
func (c *Consumer) watch(ctx context.Context) {
	var token task.Token
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := c.store.Watch(ctx, task.WatchParams{ResumeAfter: token})
		switch {
		case errors.Is(err, task.ErrWatchUnsupported):
			c.logger.Info("store has no change stream; polling", slog.Duration("interval", c.cfg.PollInterval))
			signal(c.pollNow)
			return
		case errors.Is(err, task.ErrHistoryLost):
			c.logger.Warn("change history lost; re-querying everything")
			token = nil
			continue
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			c.logger.Warn("open change stream", slog.Any("err", err))
			sleep(ctx, backoff)
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		if token == nil {
			signal(c.requery)
		}
		backoff = 10 * time.Millisecond
		err = c.pump(ctx, stream)
		token = stream.ResumeToken()
		stream.Close()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, task.ErrHistoryLost) {
			c.logger.Warn("change history lost; re-querying everything")
			token = nil
		} else {
			c.logger.Warn("change stream failed; resuming", slog.Any("err", err))
			sleep(ctx, backoff)
		}
	}
}

func (c *Consumer) pump(ctx context.Context, stream task.ChangeStream) error {
	for {
		ev, err := stream.Next(ctx)
		if err != nil {
			return err
		}
		if ev.Task == nil {
			t, err := c.store.Get(ctx, ev.Key)
			if errors.Is(err, task.ErrNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("re-read %s: %w", ev.Key, err)
			}
			ev.Task = t
		}
		select {
		case c.events <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// schedule owns the heap: it turns events, query pages and attempt results
// into claim times, and starts claim attempts while slots are free.
func (c *Consumer) schedule(ctx context.Context) {
	s := &scheduler{
		Consumer:   c,
		heap:       preempt.NewHeap(c.cfg.HeapSize),
		free:       c.cfg.Concurrency,
		lockWaiter: map[string]map[string]bool{},
		busy:       map[string]int{},
		parked:     map[string]map[string]preempt.Entry{},
		parkedBy:   map[string]string{},
	}
	safety := time.NewTicker(c.cfg.SafetyNetInterval)
	defer safety.Stop()
	var poll <-chan time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ready := false // a first query has run (after the stream opened)
	for {
		if ready {
			s.dispatch(ctx)
			// Refill before the heap runs dry when the store holds more
			// (overflow), so the slots never wait on a query; an empty heap
			// also queries now and then.
			low := s.heap.Len() == 0 || (s.overflow && s.heap.Len() < s.cfg.HeapSize/4)
			if low && s.free > 0 && !s.full() && s.queryDue() {
				s.queryFrom(ctx, s.resume)
				s.dispatch(ctx)
			}
		}
		c.queued.Store(int64(s.heap.Len()))
		timer.Reset(s.wait())
		select {
		case <-ctx.Done():
			return
		case ev := <-c.events:
			s.onEvent(ev)
			for drained := false; !drained; {
				select {
				case ev := <-c.events:
					s.onEvent(ev)
				default:
					drained = true
				}
			}
		case <-c.requery:
			ready = true
			s.query(ctx)
		case <-c.pollNow:
			ready = true
			t := time.NewTicker(c.cfg.PollInterval)
			defer t.Stop()
			poll = t.C
			s.query(ctx)
		case <-poll:
			s.query(ctx)
		case r := <-c.results:
			s.onResult(r)
		case <-timer.C:
		case <-safety.C:
			s.query(ctx)
		}
	}
}

type scheduler struct {
	*Consumer
	heap      *preempt.Heap
	free      int
	overflow  bool
	resume    *task.Task // where the next overflow query continues
	lastQuery time.Time
	// lockWaiter maps a lock key held by another process to the tasks here
	// waiting for it (still in the heap, due when that lease ends), so that
	// the holder's finish event wakes the best of them at once.
	lockWaiter map[string]map[string]bool
	// busy counts this worker's attempts holding (or claiming) a lock key;
	// parked holds the tasks that wait for a busy key here, out of the heap,
	// so that a device's queue costs no store round trips: when the holder
	// finishes, the best one is woken.
	busy     map[string]int
	parked   map[string]map[string]preempt.Entry
	parkedBy map[string]string // task key → the lock key it is parked on
}

// queryDue rate-limits the empty-heap query: soon after an overflow (more
// tasks wait in the store), else once a second.
func (s *scheduler) queryDue() bool {
	since := time.Since(s.lastQuery)
	return since > time.Second || (s.overflow && since > 20*time.Millisecond)
}

func (s *scheduler) wait() time.Duration {
	if s.free == 0 {
		return time.Hour // a result will wake us
	}
	at, ok := s.heap.Next()
	if !ok {
		return time.Second // the empty-heap query
	}
	return max(time.Until(at)+time.Millisecond, 0)
}

func (s *scheduler) wants(t *task.Task) bool {
	return len(s.cfg.Kinds) == 0 || slices.Contains(s.cfg.Kinds, t.Kind)
}

// offer puts t in the heap at the time this worker may claim it, or drops it.
func (s *scheduler) offer(t *task.Task, now time.Time) {
	if !s.wants(t) {
		return
	}
	s.mu.Lock()
	_, runningHere := s.running[t.Key]
	s.mu.Unlock()
	d := preempt.Decide(t, s.cfg.WorkerID, now)
	at := now
	switch {
	case d.Verdict == preempt.Never, runningHere && d.Verdict == preempt.Later:
		s.heap.Remove(t.Key)
		s.unpark(t.Key)
		return
	case d.Verdict == preempt.Later:
		at = d.At
	}
	if k, ok := s.parkedBy[t.Key]; ok {
		// Still waiting for its lock here: keep the newer document only.
		if e := s.parked[k][t.Key]; e.Task == nil || t.Version > e.Task.Version {
			e.Task = t
			s.parked[k][t.Key] = e
		}
		return
	}
	if !s.heap.Put(preempt.Entry{Key: t.Key, At: at, Priority: t.Priority, Seq: t.Seq, Task: t}) {
		s.dropped()
	}
}

func (s *scheduler) onEvent(ev task.Event) {
	t := ev.Task
	s.mu.Lock()
	r := s.running[t.Key]
	s.mu.Unlock()
	if r != nil && t.Version >= r.version {
		if err := r.lease.Observe(t); err != nil {
			r.cancel(err)
		}
	}
	now := s.store.Now()
	if len(t.LockKeys) > 0 && t.CountWorkers(now).Live == 0 {
		for _, k := range t.LockKeys {
			s.wakeOne(k, now)
		}
	}
	if !s.heap.Has(t.Key) && s.parkedBy[t.Key] == "" && s.full() {
		s.dropped()
		return
	}
	s.offer(t, now)
}

func (s *scheduler) onResult(r attemptResult) {
	s.free++
	if r.retry != nil && !s.heap.Put(*r.retry) {
		s.dropped()
	}
	for _, k := range r.lockKeys {
		if s.lockWaiter[k] == nil {
			s.lockWaiter[k] = map[string]bool{}
		}
		s.lockWaiter[k][r.key] = true
	}
	now := s.store.Now()
	for _, k := range r.busy {
		if s.busy[k]--; s.busy[k] <= 0 {
			delete(s.busy, k)
			s.wakeOne(k, now)
		}
	}
}

// lockKeysOf returns the lock keys of an entry's task, when known.
func lockKeysOf(e preempt.Entry) []string {
	if e.Task == nil {
		return nil
	}
	return e.Task.LockKeys
}

// dropped notes that a task was left out for lack of room: query again
// from the top once there is room, since it may sort before the resume
// point.
func (s *scheduler) dropped() {
	s.overflow = true
	s.resume = nil
}

// full reports whether the bound on tasks held here (in the heap or
// parked) is reached.
func (s *scheduler) full() bool {
	return s.heap.Len()+len(s.parkedBy) >= s.cfg.HeapSize
}

// park moves e out of the heap until its busy lock key is free here.
func (s *scheduler) park(e preempt.Entry, key string) {
	if s.parked[key] == nil {
		s.parked[key] = map[string]preempt.Entry{}
	}
	s.parked[key][e.Key] = e
	s.parkedBy[e.Key] = key
}

// unpark removes a parked task and returns its entry.
func (s *scheduler) unpark(taskKey string) (preempt.Entry, bool) {
	k, ok := s.parkedBy[taskKey]
	if !ok {
		return preempt.Entry{}, false
	}
	e := s.parked[k][taskKey]
	delete(s.parked[k], taskKey)
	delete(s.parkedBy, taskKey)
	return e, true
}

// wakeOne makes the best task waiting for lock key k due now: one parked
// here, else one waiting on another process's lease. Waking one, not all,
// spares the store a herd of failing claims.
func (s *scheduler) wakeOne(k string, now time.Time) {
	var best *preempt.Entry
	better := func(e preempt.Entry) bool {
		return best == nil || e.Priority > best.Priority || (e.Priority == best.Priority && e.Seq < best.Seq)
	}
	for _, e := range s.parked[k] {
		if better(e) {
			best = &e
		}
	}
	if best != nil {
		s.unpark(best.Key)
		best.At = now
		if !s.heap.Put(*best) {
			s.dropped()
		}
		return
	}
	for key := range s.lockWaiter[k] {
		if e, ok := s.heap.Entry(key); ok && better(e) {
			best = &e
		}
	}
	if best != nil {
		delete(s.lockWaiter[k], best.Key)
		best.At = now
		s.heap.Put(*best)
	}
}

// query loads candidates page by page: ready tasks in priority order, then
// upcoming ones by claim time, until the heap is full.
func (s *scheduler) query(ctx context.Context) { s.queryFrom(ctx, nil) }

// queryFrom is query continuing the ready tasks after resume (when the last
// query filled the heap there), so that a worker draining a long queue does
// not re-read what it already holds.
func (s *scheduler) queryFrom(ctx context.Context, resume *task.Task) {
	s.lastQuery = time.Now()
	s.overflow = false
	s.resume = nil
	now := s.store.Now()
	for _, ready := range []bool{true, false} {
		after := resume
		resume = nil
		for {
			if s.full() {
				s.overflow = true
				if ready {
					s.resume = after
				}
				return
			}
			page, err := s.store.Candidates(ctx, task.CandidateQuery{
				Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: now, Ready: ready, After: after, Limit: s.cfg.PageSize,
			})
			if err != nil {
				if ctx.Err() == nil {
					s.logger.Warn("candidate query", slog.Any("err", err))
					s.overflow = true // try again when the heap drains
				}
				return
			}
			for i, t := range page {
				s.offer(t, now)
				if s.full() && i < len(page)-1 {
					page = page[:i+1] // resume after the last one kept
					break
				}
			}
			if len(page) > 0 {
				after = page[len(page)-1]
			}
			if len(page) < s.cfg.PageSize && !s.full() {
				break
			}
		}
	}
}

// dispatch starts a claim attempt for each due entry while slots are free.
func (s *scheduler) dispatch(ctx context.Context) {
	for s.free > 0 {
		e, ok := s.heap.Pop(s.store.Now())
		if !ok {
			return
		}
		keys := lockKeysOf(e)
		if i := slices.IndexFunc(keys, func(k string) bool { return s.busy[k] > 0 }); i >= 0 {
			s.park(e, keys[i])
			continue
		}
		for _, k := range keys {
			s.busy[k]++
		}
		s.free--
		s.runs.Add(1)
		go func() {
			defer s.runs.Done()
			r := s.attempt(ctx, e)
			r.busy = keys
			select {
			case s.results <- r:
			case <-s.scheduleDone:
			}
		}()
	}
}
