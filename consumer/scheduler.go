package consumer

// The scheduler turns change events, query pages and attempt results into
// claim times, and starts claim attempts while slots are free; due tasks
// a pause covers wait aside until it lifts, and those over a rate limit
// until a slot frees. Where each task it holds stands, and the claim heap
// that orders them, are the claim table's (consumer/internal/claimtab).
// It runs in one goroutine; the run table and the lock queue are shared
// with the attempts.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/consumer/internal/runtab"
	"github.com/leasepool/leasepool/consumer/internal/standby"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

type scheduler struct {
	cfg     Config
	store   task.Store
	logger  *slog.Logger
	running *runtab.Table[*run]
	// attempt claims an entry's task and runs it; it is started in its own
	// goroutine, counted by inflight, and reports to results. It calls
	// decided once the claim is written or given up, before running, and
	// landed as the handler of a claim landed starts.
	attempt  func(ctx context.Context, e preempt.Entry, decided, landed, handled func()) attemptResult
	inflight *sync.WaitGroup
	results  chan attemptResult
	// landed is the attempts' notices of claims landed, and spare the
	// list the loop last took from it (drainLanded).
	landed  *landings
	spare   []landing
	handled chan bool       // a claimed attempt's handler returned: its slot is free (true: the instant lane's)
	done    <-chan struct{} // closed once the scheduler returned
	queued  *atomic.Int64

	// tab is every task held here and its state; the claim heap is its
	// own index, and the lock queue's lines are too (locks: the busy keys
	// and flights are the scheduler's and the attempts').
	tab   *claimtab.Table
	locks *claimtab.Locks
	// ctl is the pauses and limits as last loaded (reload reads them
	// again).
	ctl    *atomic.Pointer[control.State]
	reload func(context.Context)
	// slots is what this process knows of the rate limits' slot locks;
	// claimsDone receives the rate keys of each claim once decided.
	slots      *slotTable
	claimsDone chan []string
	// free is the Concurrency slots left; lane the instant lane's claims
	// running (dispatch).
	free, lane int
	overflow   bool
	resume     *task.Task // where the next overflow query continues
	// resumeShare is the share the backlog past resume is read by (nil:
	// all of it), queriedShare this worker's share when the last full
	// query ran, and shareBuckets its share under shareOf.
	resumeShare, queriedShare []int
	shareBuckets              []int
	shareOf                   *preempt.Peers
	lastQuery                 time.Time
	// queryFailed: the last refill query failed, so the next one the
	// loop wakes for waits a second (see untilQueryDue).
	queryFailed bool
	// pausedOut: a task a pause covers was let go, the tasks held aside
	// being at their bound (asideFull): a reload queries again. The tasks
	// let go on a lock key busy here are the claim table's (LetGo): the
	// key's freeing queries again (freed), and so does the safety net.
	pausedOut bool
	// gate is Config.Handler's, if it is a Gate (gate.go); gateWakes
	// receives the holds that ended, and letGoWakes are the wakes watched
	// for tasks a gate kept back and let go for lack of room.
	gate       Gate
	gateWakes  chan gateWake
	letGoWakes map[<-chan struct{}]bool
	// A refill page of a long backlog is read in its own goroutine, so
	// that slots freed meanwhile are refilled from the heap rather than
	// waiting for the query (a page is a few milliseconds of reads and
	// decoding); the claim table keeps, while one is in flight, the
	// newest document of each task an event or attempt brought meanwhile,
	// which the page's, read earlier, must not replace (claimtab.Idle).
	pages chan fetchedPage
	// peers is the registry's live workers (claim spreading); standBy
	// is this worker's stand-by before each claim, by its rank of the
	// task among them.
	peers   *atomic.Pointer[preempt.Peers]
	standBy *standby.Ranker
	// fair orders grouped tasks by their share (groups.go).
	fair fairClock
}

// scheduleInputs are what wakes the scheduler.
type scheduleInputs struct {
	events  <-chan task.Event
	requery <-chan struct{} // the change stream opened: query everything
	pollNow <-chan struct{} // the store cannot push: poll
	control <-chan struct{} // the pauses and limits were reloaded
}

func (c *Consumer) newScheduler() *scheduler {
	s := &scheduler{
		cfg: c.cfg, store: c.store, logger: c.logger, running: c.running,
		attempt: c.attempt, inflight: &c.runs, results: c.results, handled: c.handled, done: c.scheduleDone, queued: &c.queued,
		locks: c.locks, free: c.cfg.Concurrency, landed: newLandings(),
		ctl: &c.ctl, reload: c.loadControl,
		slots: &c.slots, claimsDone: make(chan []string, c.cfg.Concurrency),
		pages:   make(chan fetchedPage, 1),
		peers:   &c.peers,
		standBy: standby.New(c.cfg.WorkerID, preempt.Spread{Step: c.cfg.ClaimSpread, MaxRank: preempt.DefaultSpread.MaxRank}, &c.peers, 4*c.cfg.HeapSize),
	}
	s.gate, _ = c.cfg.Handler.(Gate)
	s.gateWakes, s.letGoWakes = make(chan gateWake, 64), map[<-chan struct{}]bool{}
	s.tab = claimtab.New(claimtab.Config{HeapSize: c.cfg.HeapSize, InstantKinds: c.cfg.InstantKinds, Locks: s.locks, Dropped: s.dropped, Strict: strictStates, LetGoRoom: 4 * c.cfg.HeapSize,
		Refused: func(key string, from, to claimtab.State) {
			s.logger.Error("claim table refused a move", slog.String("task", key), slog.String("from", from.String()), slog.String("to", to.String()))
		}})
	return s
}

// run is the scheduler's loop, until ctx is done.
func (s *scheduler) run(ctx context.Context, in scheduleInputs) {
	safety := time.NewTicker(s.cfg.SafetyNetInterval)
	defer safety.Stop()
	var poll <-chan time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ready := false // a first query has run (after the stream opened)
	for {
		s.drainLanded()
		if strictStates {
			s.checkStates()
		}
		refill := time.Hour // when a refill queryDue put off is due
		if ready {
			s.dispatch(ctx)
			// Refill before the heap runs dry, or holds nothing due, when
			// the store holds more (overflow), so the slots never wait on a
			// query. A heap that holds everything the last query found
			// (no overflow) is kept true by the change stream alone: an
			// idle worker does not query, so idle workers add no reads
			// (the safety net still queries now and then).
			low := (s.overflow || s.queryFailed) && (s.tab.HeapLen() < s.cfg.HeapSize/4 || !s.anyDue())
			if low && s.shareMoved() {
				s.resume, s.resumeShare = nil, nil
			}
			switch {
			case s.tab.Paging() || !low || s.full():
			case s.resume != nil:
				s.fetch(ctx) // the next page of a backlog, read aside
			case s.free > 0 && s.queryDue():
				s.query(ctx)
				s.dispatch(ctx)
			case s.free > 0:
				// Put off: wake for it. A heap holding only later entries
				// (a lease held elsewhere, a task run at a later time)
				// sets no timer sooner, and once its own attempts' events
				// are in, nothing else may come to wake the loop: the
				// store's ready backlog would wait for the safety net.
				refill = s.untilQueryDue()
			}
		}
		if ready {
			s.retag(s.store.Now()) // groups.go
			s.topUp(ctx)
		}
		s.queued.Store(int64(s.tab.HeapLen()))
		timer.Reset(min(s.wait(), refill))
	wait:
		select {
		case <-ctx.Done():
			return
		case ev := <-in.events:
			s.onEvent(ev)
			for drained := false; !drained; {
				select {
				case ev := <-in.events:
					s.onEvent(ev)
				default:
					drained = true
				}
			}
		case <-in.requery:
			ready = true
			s.query(ctx)
		case <-in.pollNow:
			ready = true
			t := time.NewTicker(s.cfg.PollInterval)
			defer t.Stop()
			poll = t.C
			s.reload(ctx)
			s.query(ctx)
		case <-poll:
			s.tab.ClearLetGo()
			s.reload(ctx)
			s.query(ctx)
		case <-in.control:
			s.onControl()
		case r := <-s.results:
			s.onResult(r)
		case <-s.landed.wake:
			// A claim landed: nothing is freed or due by it, so the turn
			// only takes the notices and waits on (the top of the next
			// turn takes them too).
			s.drainLanded()
			goto wait
		case p := <-s.pages:
			s.onPage(p)
		case w := <-s.gateWakes:
			s.onGateWake(w)
		case instant := <-s.handled:
			s.release(instant)
		case keys := <-s.claimsDone:
			now := s.store.Now()
			for _, k := range s.locks.Unhold(keys) {
				s.tab.WakeOne(k, now)
			}
		case <-timer.C:
		case <-safety.C:
			s.tab.ClearLetGo() // a finish event missed must not hold a line for good
			s.reload(ctx)
			s.query(ctx)
		}
	}
}

func (s *scheduler) wait() time.Duration {
	if s.free <= 0 {
		// Every slot is taken: only an instant task may start (dispatch).
		at, ok := s.tab.NextInstant()
		if !ok || s.lane >= InstantSlots {
			return time.Hour // a result will wake us
		}
		return max(time.Until(at)+time.Millisecond, 0)
	}
	at, ok := s.tab.Next()
	if !ok {
		return time.Second // the empty-heap query
	}
	return max(time.Until(at)+time.Millisecond, 0)
}

func (s *scheduler) wants(t *task.Task) bool {
	return len(s.cfg.Kinds) == 0 || slices.Contains(s.cfg.Kinds, t.Kind)
}

// offer puts t in the heap at the time this worker may claim it, or drops
// it. A document older than the one held is refused whatever the key's
// state (claimtab.Newer); one of a key being claimed is kept for the result.
func (s *scheduler) offer(t *task.Task, now time.Time) {
	if st := s.tab.State(t.Key); (st == claimtab.LockWaiting || st == claimtab.RateWaiting) && !claimtab.Newer(t, s.tab.Doc(t.Key)) {
		// Its wait stands: a query's row no newer than the document it
		// waits on says nothing freed it. Made due, it would try a claim
		// bound to fail, and a refill finding it due would read again.
		return
	}
	if !s.wants(t) || !s.tab.See(t) || s.tab.State(t.Key).InFlight() {
		return
	}
	if !s.tab.State(t.Key).Held() && s.letAside(t) {
		return
	}
	runningHere := s.running.Get(t.Key) != nil
	d := preempt.Decide(t, s.cfg.WorkerID, now)
	at := now
	switch {
	case d.Verdict == preempt.Never, runningHere && d.Verdict == preempt.Later:
		s.tab.Forget(t.Key)
		return
	case d.Verdict == preempt.Later:
		at = d.At
	case !t.NextClaimAt.IsZero() && t.NextClaimAt.Before(now):
		at = t.NextClaimAt // claimable since then: its stand-by may be over
	}
	// Due tasks of one priority go in publish order, each shifted by this
	// worker's stand-by: of a backlog, each worker takes first the tasks
	// it is preferred for, and a task retried or taken over still comes
	// before those published after it.
	delay := s.standBy.Delay(t, now)
	order := s.fairOrder(t, at, delay) // groups.go
	s.tab.Place(preempt.Entry{Key: t.Key, At: at.Add(delay), Order: order, Priority: t.Priority, Seq: t.Seq, Task: t})
}

func (s *scheduler) onEvent(ev task.Event) {
	t := ev.Task
	s.tab.See(t)
	if r := s.running.Get(t.Key); r != nil && !claimtab.NewerVersion(r.seq, r.version, t.Seq, t.Version) {
		if err := r.lease.Observe(t); err != nil {
			r.cancel(err)
		}
	}
	now := s.store.Now()
	s.standBy.NoteLag(ev, now)
	s.concurrencyEnded(t, now) // concurrency.go
	if len(t.LockKeys) > 0 && t.CountWorkers(now).Live == 0 {
		for _, k := range t.LockKeys {
			s.tab.WakeOne(k, now)
			if len(t.Attempts) > 0 {
				s.freed(k) // an attempt ended, not a publish
			}
		}
	}
	if s.tab.State(t.Key).InFlight() {
		return // noted for the result: see offer
	}
	if !s.tab.State(t.Key).Held() && s.full() {
		// No room: a task of higher priority than some held takes the
		// place of the lowest (queried again later), so an urgent task is
		// not kept waiting behind a full heap of a long backlog.
		s.dropped()
		if t.State.Finished() || !s.wants(t) {
			return
		}
		if !s.tab.EvictBelow(t.Priority) && !s.evictLater(t, now) && !s.evictFair(t, now) {
			return
		}
	}
	s.offer(t, now)
}

// onResult takes an attempt's result. The notices of claims landed are
// taken first, so the key is running if its claim landed and claiming if
// not (claimtab.Table.Result checks it). The change events and queries
// that came while it was in flight were only noted: the task
// goes back to the heap by the newest document known, the attempt's or
// theirs. A retry decided on an older document than one heard would
// start a claim bound to conflict, and a document heard that is no newer
// than the attempt's own is offered only when no retry was asked for.
// Events come in order, so while one is due for a version the attempt
// knows, it will offer the task again; but once the events went as far
// (the outcome write's handled before this result, say), none is due,
// and an older retry put back would stand until the next query: a task
// snoozed for 10 ms would wait for the lease its claim saw to end.
func (s *scheduler) onResult(r attemptResult) {
	s.drainLanded()
	if err := s.tab.Result(r.key, r.attempt, r.landed); err != nil {
		if strictStates {
			panic("claim table: " + err.Error())
		}
		s.logger.Error("claim table: an attempt's result out of step", slog.Any("err", err))
	}
	if !r.slotFreed {
		s.release(r.instant)
	}
	now := s.store.Now()
	seen := s.tab.Heard(r.key)
	if s.locks.Landed(r.busy, r.wakes) && r.retry != nil && len(r.lockKeys) > 0 {
		r.retry.At = now // what stopped it may be gone: see claimtab.Locks.flights
	}
	retry := r.retry
	if retry != nil && retry.Task != nil && claimtab.Newer(seen, retry.Task) {
		retry = nil // decided on an older document than seen
	}
	if retry != nil && retry.Task != nil && len(r.lockKeys) == 0 && !r.limited {
		// Not now (a peer's claim won, say): when the task is claimable
		// again, this worker's turn comes after its stand-by as for any
		// offer, or every worker that lost the race would try at once.
		delay := s.standBy.Delay(retry.Task, now)
		retry.At, retry.Order = retry.At.Add(delay), s.fairOrder(retry.Task, now, delay)
	}
	if retry != nil {
		s.tab.Queue(*retry)
	} else {
		// The newest document known, the attempt's or one heard: an
		// attempt that ended with no write (its lease lost, its outcome
		// not written) leaves the task claimable at its lease end with no
		// change event to come, and an idle worker runs no query.
		s.tab.Forget(r.key)
		latest := seen
		if latest == nil || claimtab.Newer(r.doc, latest) {
			latest = r.doc
		}
		if latest != nil {
			s.offer(latest, now)
		}
	}
	s.tab.Note(r.doc)
	if r.limited {
		s.tab.NoteRateWait(r.key)
	}
	if e, ok := s.tab.Entry(r.ahead); ok && e.At.After(now) {
		// The key is free but a place ahead in its line stopped the
		// claim: the task holding that place may wait here for a lease
		// that has ended, since a holder's finish event wakes one waiter
		// a process, and the line would stand still, the key idle, until
		// that wait ended (up to a lease). It tries now.
		s.tab.Wake(e, now)
	}
	s.tab.WaitLocks(r.key, r.lockKeys)
	for _, k := range s.locks.Unhold(r.busy) {
		if len(r.lockKeys) > 0 {
			// Stopped by another process's hold (or the line): the next
			// task parked here tries in turn, while those already waiting
			// wait on (for that holder's finish event or lease end); waking
			// them would only have them fail again, round and round.
			s.tab.WakeParked(k, now)
			continue
		}
		s.tab.WakeOne(k, now)
		s.freed(k)
	}
}

// drainLanded moves to running the keys whose claims landed since the
// last drain (landings).
func (s *scheduler) drainLanded() {
	list := s.landed.take(s.spare)
	for _, n := range list {
		s.tab.Land(n.key, n.attempt)
	}
	s.spare = list
}

// dropped notes that a task was left out for lack of room: query again
// from the top once there is room, since it may sort before the resume
// point.
func (s *scheduler) dropped() {
	s.overflow = true
	s.resume, s.resumeShare = nil, nil
}

// full reports whether the bound on tasks held here (in the heap, parked
// or paused) is reached.
func (s *scheduler) full() bool {
	return s.tab.Held() >= s.cfg.HeapSize
}

// evictLater makes room for t when it is claimable here before the latest
// entry of its priority is due.
func (s *scheduler) evictLater(t *task.Task, now time.Time) bool {
	d := preempt.Decide(t, s.cfg.WorkerID, now)
	at := now
	switch d.Verdict {
	case preempt.Never:
		return false
	case preempt.Later:
		at = d.At
	}
	return s.tab.EvictLater(t.Priority, at)
}
