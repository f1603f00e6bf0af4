package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/ping"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// attempt claims e's task and, when that succeeds, runs it to the end. It
// returns what the scheduler should do with the task if it was not claimed.
// Each try decides the claim once on the document it writes, takes the
// task's lock keys and rate-limit slots for the new attempt, and writes
// the claim with compare-and-set; a lost race re-reads and tries again.
// decided is called once the claim is written or given up; landed and
// handled, when a claimed attempt's handler starts and has returned (see
// run).
func (c *Consumer) attempt(ctx context.Context, e preempt.Entry, decided, landed, handled func()) attemptResult {
	res := attemptResult{key: e.Key}
	try := &claimTry{r: c.rules, ctx: ctx}
	// A claim that lands after its own lease would have ended is no claim:
	// bound the tries by a lease (run checks what is left of it).
	timeout := task.DefaultWorkerTimeout
	if e.Task != nil {
		timeout = time.Duration(e.Task.WorkerTimeout)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	try.ctx = wctx
	cur := e.Task
	if takesOver(cur, c.cfg.WorkerID, c.store.Now()) {
		// The change stream leaves out renewals (task.Task.Quiet): the
		// lease seen here may have been renewed since. Deciding a takeover
		// on the stored document costs a read; on the one heard, a claim
		// bound to conflict.
		cur = nil
	}
	doc, err := task.ModifyFrom(wctx, c.store, e.Key, cur, try.claim)
	cancel()
	decided()
	res.doc = doc
	var wait *notNow
	var locked *task.LockedError
	var limited *rateLimited
	switch {
	case err == nil && try.reaped:
		c.logger.Warn("task failed: workers expired and retries are exhausted", slog.String("task", e.Key))
		if c.cfg.Reaped != nil {
			c.cfg.Reaped(ctx, doc)
		}
	case err == nil:
		c.observeClaim(doc, try)
		res.doc = c.run(doc, try.holder, try.wait(), landed, handled)
	case errors.As(err, &wait):
		if wait.Verdict == preempt.Later {
			res.retry = retryEntry(e, doc, wait.At)
		}
	case errors.Is(err, errPaused):
		// Due now: the scheduler holds it back while the pause lasts.
		res.retry = retryEntry(e, doc, c.store.Now())
	case errors.As(err, &limited):
		res.retry = retryEntry(e, doc, limited.until)
		res.limited = true
	case errors.As(err, &locked):
		// Try again when the holder's lease (or the place ahead) ends, but
		// within a lease: that try renews this task's own place in the
		// line (it lasts two), which would lapse if the wait were longer.
		at := locked.Until
		if soon := c.store.Now().Add(timeout); at.After(soon) {
			at = soon
		}
		res.retry = retryEntry(e, doc, at)
		res.lockKeys = doc.LockKeys
		if locked.Ahead {
			res.ahead = locked.Holder.TaskKey
		}
	case errors.Is(err, task.ErrNotFound), ctx.Err() != nil:
		try.free()
	default:
		if doc, ok := c.adoptClaim(ctx, e.Key, try); ok {
			c.observeClaim(doc, try)
			res.doc = c.run(doc, try.holder, try.wait(), landed, handled)
			break
		}
		try.free()
		c.logger.Warn("claim", slog.String("task", e.Key), slog.Any("err", err))
		res.retry = retryEntry(e, nil, c.store.Now().Add(time.Second))
	}
	return res
}

// adoptClaim reads the task after a claim write that failed with a store
// error, whose outcome is unknown: the write may have applied before the
// answer was lost. When the stored document holds the claim's lease, the
// claim landed and is run now. Otherwise this worker would see its own
// live lease, wait for it to end, take it over and count it as a failed
// attempt: a task whose claims kept meeting such errors would fail,
// retries exhausted, without ever running.
func (c *Consumer) adoptClaim(ctx context.Context, key string, try *claimTry) (*task.Task, bool) {
	if try.reaped || try.holder.WorkerID == "" || ctx.Err() != nil {
		return nil, false
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	doc, err := c.store.Get(rctx, key)
	if err != nil {
		return nil, false
	}
	i := doc.Entry(try.holder)
	if i < 0 || doc.Attempts[i].State != task.AttemptRunning || !c.store.Now().Before(doc.Attempts[i].LeaseUntil) {
		return nil, false
	}
	return doc, true
}

// takesOver reports whether a claim of t at now would replace another
// worker's lease that t shows as ended.
func takesOver(t *task.Task, self string, now time.Time) bool {
	if t == nil {
		return false
	}
	for _, w := range t.Attempts {
		if w.WorkerID != self && w.Expired(now) {
			return true
		}
	}
	return false
}

// notNow is a claim's decision not to claim now (Never or Later).
type notNow struct{ preempt.Decision }

func (n *notNow) Error() string { return fmt.Sprintf("not claimable: %s", n.Reason) }

func retryEntry(e preempt.Entry, doc *task.Task, at time.Time) *preempt.Entry {
	e.Task, e.At = doc, at
	return &e
}

// run executes a claimed attempt: pings while the handler runs, then writes
// the outcome (or releases the lease on shutdown); it returns the newest
// document the attempt knows (its outcome write). landed is called as the
// handler is about to start (the scheduler moves the task to running;
// the call does not wait for it), not for a claim that landed too late
// to run. handled is called as
// soon as the handler has returned, before the outcome write: the slot is
// free then, and the next claim, dispatched at once, goes to the store
// with this outcome, often in the same commit, rather than after it.
//
// The attempt is a span (see internal/tracing) in the task's trace, from
// the claim to the outcome's write; wait is how long the task was
// claimable before the claim.
func (c *Consumer) run(doc *task.Task, holder task.Holder, wait time.Duration, landed, handled func()) *task.Task {
	c.claimed.Add(1)
	attempt := holder.Attempt
	lease := ping.New(c.store, doc, holder, c.logger)
	if lease.Remaining() <= 0 {
		// The claim took about as long as the lease (a store outage): a
		// peer may claim it any moment, so do not start.
		c.leaseLost.Add(1)
		c.cfg.Observer.Finished(FinishEvent{Kind: doc.Kind, Group: doc.Group, Attempt: attempt, Outcome: OutcomeLeaseLost})
		c.logger.Warn("claim landed after its lease ended; not starting", slog.String("task", doc.Key), slog.Int("attempt", attempt))
		if keys := doc.LockKeys; len(keys) > 0 {
			c.releaseLocks(task.LockParams{Keys: keys, Holder: lease.Holder()})
		}
		// Its concurrency slots run out with the lease, as a lost lease's
		// do: the store shows the attempt running until then, and a slot
		// freed now would let the history show more running than the
		// limit (releaseSlotsAfter).
		return doc
	}
	tctx, span := tracing.StartRun(c.handlerCtx, tracing.Run{
		Kind: doc.Kind, Key: doc.Key, WorkerID: c.cfg.WorkerID, Attempt: attempt, Wait: wait,
		Traceparent: doc.Trace.Traceparent, Tracestate: doc.Trace.Tracestate,
	})
	hctx, cancel := context.WithCancelCause(tctx)
	defer cancel(nil)
	me := &run{lease: lease, seq: doc.Seq, version: doc.Version, cancel: cancel}
	landed() // before the run table shows it: see checkStates
	c.running.Set(doc.Key, me)

	job := &Job{Task: doc, Attempt: attempt, WorkerID: c.cfg.WorkerID, holder: holder, lease: lease}
	job.out.now = c.store.Now
	lease.Carry(job.Output) // renewals store what the handler recorded so far

	stopPing := lease.Start(cancel)

	log := attemptLog{c.logger, doc.Key, attempt}
	log.Debug("task started", slog.String("kind", doc.Kind))
	began := time.Now()
	err := c.invoke(hctx, job)
	ended := c.store.Now() // the work ended here, before its locks are freed
	took := time.Since(began)
	stopPing()
	c.running.Remove(doc.Key, me)
	handled()

	// The handler is done with its resources: free them before the outcome
	// write, whose change event is what wakes the workers waiting for them.
	// Not after a lost lease, though: the handler's last side effect (an
	// MQTT command in flight) may still land, so the locks run out on their
	// own, at the lease's end. A handler that finished its attempt in its
	// own transaction (Job.Succeeded) is done, whatever its renewals saw since.
	settled := job.settled()
	if keys := lease.Doc().LockKeys; len(keys) > 0 && (settled != nil || !errors.Is(context.Cause(hctx), task.ErrLeaseLost)) {
		now := c.store.Now()
		c.releaseLocks(task.LockParams{Keys: keys, Holder: lease.Holder(), Now: now, Heirs: c.locks.Heirs(keys, now)})
	}
	running := lease.Doc() // its entry names the concurrency slots held
	outcome := OutcomeSucceeded
	if settled != nil {
		_ = lease.Observe(settled) // the newest document; it shows the attempt over
		c.succeeded.Add(1)
	} else {
		outcome = c.settle(hctx, lease, err, ended, log)
	}
	c.rules.releaseSlotsAfter(running, lease.Holder(), outcome) // concurrency.go
	if span != nil {
		span.SetAttributes(tracing.String("leasepool.outcome", string(outcome)))
		switch outcome {
		case OutcomeSucceeded, OutcomeSnoozed, OutcomeReleased, OutcomeTaskDone:
			err = nil // not a failure of the attempt
		}
		span.End(err)
	}
	c.cfg.Observer.Finished(FinishEvent{Kind: doc.Kind, Group: doc.Group, Attempt: attempt, Outcome: outcome, Started: true, Duration: took})
	return lease.Doc()
}

// wait is how long the claimed task was claimable before the claim.
func (ct *claimTry) wait() time.Duration { return max(ct.claimedAt.Sub(ct.readyAt), 0) }

// observeClaim tells the observer of the claim try wrote.
func (c *Consumer) observeClaim(doc *task.Task, try *claimTry) {
	c.cfg.Observer.Claimed(ClaimEvent{
		Kind: doc.Kind, Group: doc.Group, Attempt: try.holder.Attempt,
		Wait: try.wait(), TakenOver: try.takenOver,
	})
}

// settle writes the attempt's outcome and returns it.
// ended is when the handler returned: an outcome is judged against the
// lease as it stood then, and a peer's claim since makes the write fail.
func (c *Consumer) settle(hctx context.Context, lease *ping.Renewer, err error, ended time.Time, log attemptLog) Outcome {
	out := lease.Output() // what the handler recorded: every write here stores it
	if o, lost := c.settleLost(context.Cause(hctx), lease, out, log); lost {
		return o
	}
	cause := context.Cause(hctx)
	var snooze *SnoozeError
	var write func(t *task.Task) error
	h := lease.Holder()
	switch {
	case err != nil && (errors.Is(cause, ErrShutdown) || c.handlerCtx.Err() != nil):
		// Stop, or the Start context ended: give the attempt back.
		write = func(t *task.Task) error { return t.Release(h, ended) }
		c.released.Add(1)
		log.Info("lease released on shutdown")
		err = ErrShutdown
	case errors.As(err, &snooze):
		write = func(t *task.Task) error { return t.Snooze(h, ended.Add(snooze.Delay), ended) }
		c.snoozed.Add(1)
	case err == nil:
		write = func(t *task.Task) error { return t.Succeed(h, ended) }
	default:
		msg := err.Error()
		write = func(t *task.Task) error {
			failures := t.CountWorkers(ended).Unexpected + 1
			return t.Fail(h, msg, ended.Add(c.cfg.RetryPolicy(failures, err)), ended)
		}
	}
	if werr := c.writeOutcome(lease, withOutput(h, out, write)); werr != nil {
		if errors.Is(werr, task.ErrLeaseLost) {
			c.leaseLost.Add(1)
			log.Warn("outcome refused: lease lost", slog.Any("err", werr))
			if errors.Is(werr, task.ErrCancelled) {
				return OutcomeCancelled
			}
			return OutcomeLeaseLost
		}
		log.Error("outcome not written; the lease will expire and a peer will retry", slog.Any("err", werr))
		return OutcomeNotWritten
	}
	switch {
	case snooze != nil:
		return OutcomeSnoozed
	case errors.Is(err, ErrShutdown):
		return OutcomeReleased
	case err == nil:
		c.succeeded.Add(1)
		log.Debug("task succeeded")
		return OutcomeSucceeded
	default:
		c.failed.Add(1)
		log.Warn("task attempt failed", slog.Any("err", err))
		if lease.Doc().State == task.StateFailed {
			return OutcomeFailed
		}
		return OutcomeRetried
	}
}

// settleLost ends an attempt whose lease was lost (cause): unpinned, the
// task finished by others, cancelled or preempted. It reports false when
// the lease still stood, leaving the outcome to settle.
func (c *Consumer) settleLost(cause error, lease *ping.Renewer, out task.Output, log attemptLog) (Outcome, bool) {
	if errors.Is(cause, task.ErrUnpinned) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = lease.Unpin(ctx)
		cancel()
	}
	h := lease.Holder()
	if errors.Is(cause, task.ErrTaskDone) {
		log.Info("task finished by other workers; handler stopped")
		release := func(t *task.Task) error { return t.Release(h, c.store.Now()) }
		if err := c.writeOutcome(lease, withOutput(h, out, release)); err != nil {
			log.Debug("release after the task finished", slog.Any("err", err))
		}
		return OutcomeTaskDone, true
	}
	if errors.Is(cause, task.ErrCancelled) && (len(out.Result) > 0 || len(out.Log) > 0) {
		// The cancel ended the attempt; what its handler recorded is kept.
		if err := c.writeOutcome(lease, func(t *task.Task) error { return t.RecordCancelled(h, out) }); err != nil {
			log.Debug("output of a cancelled attempt not stored", slog.Any("err", err))
		}
	}
	if errors.Is(cause, task.ErrLeaseLost) {
		c.leaseLost.Add(1)
		log.Warn("lease lost; handler cancelled", slog.Any("cause", cause))
		if errors.Is(cause, task.ErrCancelled) {
			return OutcomeCancelled, true
		}
		return OutcomeLeaseLost, true
	}
	return "", false
}

// writeOutcome retries store errors with backoff while the lease may still
// be ours; the write itself refuses once it is not.
func (c *Consumer) writeOutcome(lease *ping.Renewer, fn func(*task.Task) error) error {
	backoff := 20 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := lease.Write(ctx, fn)
		cancel()
		if err == nil || errors.Is(err, task.ErrLeaseLost) {
			return err
		}
		doc := lease.Doc()
		i := doc.Entry(lease.Holder())
		if i < 0 || !c.store.Now().Before(doc.Attempts[i].LeaseUntil) {
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Consumer) releaseLocks(p task.LockParams) { c.rules.releaseLocks(p) }

// invoke calls the handler, turning panics into errors with the stack and
// retrying Retryable errors with backoff while the context lives.
func (c *Consumer) invoke(ctx context.Context, job *Job) error {
	backoff := c.cfg.RetryBackoff
	for try := 0; ; try++ {
		err := c.call(ctx, job)
		if err == nil || !IsRetryable(err) || try >= c.cfg.LocalRetries || ctx.Err() != nil {
			return err
		}
		c.logger.Info("retrying handler", slog.String("task", job.Task.Key), slog.Int("try", try+1), slog.Any("err", err))
		if !sleep(ctx, backoff) {
			return err
		}
		backoff *= 2
	}
}

func (c *Consumer) call(ctx context.Context, job *Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return c.cfg.Handler.Handle(ctx, job)
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// signal wakes a channel of capacity one without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// attemptLog logs about one attempt, with its task and attempt number.
// Unlike Logger.With, which has the handler format them at once, for every
// attempt at any level, it adds them only to the records logged.
type attemptLog struct {
	l       *slog.Logger
	key     string
	attempt int
}

func (a attemptLog) log(level slog.Level, msg string, args []any) {
	ctx := context.Background()
	if !a.l.Enabled(ctx, level) {
		return
	}
	var pc [1]uintptr
	runtime.Callers(3, pc[:]) // the caller of Debug, Info, ...: the record's source
	r := slog.NewRecord(time.Now(), level, msg, pc[0])
	r.AddAttrs(slog.String("task", a.key), slog.Int("attempt", a.attempt))
	r.Add(args...)
	_ = a.l.Handler().Handle(ctx, r)
}

func (a attemptLog) Debug(msg string, args ...any) { a.log(slog.LevelDebug, msg, args) }
func (a attemptLog) Info(msg string, args ...any)  { a.log(slog.LevelInfo, msg, args) }
func (a attemptLog) Warn(msg string, args ...any)  { a.log(slog.LevelWarn, msg, args) }
func (a attemptLog) Error(msg string, args ...any) { a.log(slog.LevelError, msg, args) }
