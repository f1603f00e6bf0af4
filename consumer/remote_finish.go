package consumer

// A remote attempt's renewals and its outcome, fenced by its holder.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/ping"
	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// Renew extends a's lease, appending log to its attempt's log in the same
// write. It returns the document written, or an error wrapping
// task.ErrLeaseLost (ErrCancelled, ErrTaskDone, ErrUnpinned) with nothing
// written, or task.ErrNotFound.
func (r *RemoteWorkers) Renew(ctx context.Context, a RemoteAttempt, log []string) (*task.Task, error) {
	ren, err := r.renewer(ctx, a)
	if err != nil {
		return nil, err
	}
	if len(log) > RemoteMaxLogLines {
		return nil, fmt.Errorf("%w: log: more than %d lines", task.ErrInvalid, RemoteMaxLogLines)
	}
	err = ren.RenewAnd(ctx, func(t *task.Task, now time.Time) { appendLog(t, a.holder(), log, now) })
	return ren.Doc(), err
}

// renewer reads a's task and returns its Renewer, or the loss the stored
// document shows.
func (r *RemoteWorkers) renewer(ctx context.Context, a RemoteAttempt) (*ping.Renewer, error) {
	if a.Attempt < 1 {
		return nil, fmt.Errorf("%w: attempt: must be at least 1", task.ErrInvalid)
	}
	doc, err := r.cfg.Store.Get(ctx, a.Key)
	if err != nil {
		return nil, err
	}
	if len(a.Kinds) > 0 && !slices.Contains(a.Kinds, doc.Kind) {
		return nil, fmt.Errorf("task %s is of kind %q: %w", a.Key, doc.Kind, ErrKindNotAllowed)
	}
	ren := ping.New(r.cfg.Store, doc, a.holder(), r.cfg.Logger)
	if cause := ren.Observe(doc); cause != nil {
		if errors.Is(cause, task.ErrUnpinned) {
			cause = ren.Unpin(ctx)
		}
		return nil, cause
	}
	return ren, nil
}

// appendLog adds lines to h's attempt's log at now, as Job.Log would.
func appendLog(t *task.Task, h task.Holder, lines []string, now time.Time) {
	i := t.Entry(h)
	if len(lines) == 0 || i < 0 {
		return
	}
	w := t.Attempts[i]
	out := task.Output{Result: w.Result, Log: slices.Clone(w.Log), LogDropped: w.LogDropped}
	for _, l := range lines {
		out.Log = append(out.Log, task.LogLine{At: now, Msg: l})
	}
	t.Record(h, out)
}

// RemoteOutcome is how a remote attempt ended.
type RemoteOutcome struct {
	// Outcome is OutcomeSucceeded, OutcomeFailed (Error says why; the
	// task retries while its retries allow), OutcomeSnoozed (for Snooze)
	// or OutcomeReleased.
	Outcome Outcome
	Result  []byte // JSON, for OutcomeSucceeded; at most task.MaxResultSize
	Error   string
	Snooze  time.Duration
	Log     []string
}

// Finish writes a's outcome and returns the document written and the
// outcome as stored (OutcomeRetried for a failure that leaves the task to
// run again). A finish from anyone but the current holder of a live lease
// is refused as Renew refuses, with nothing written.
func (r *RemoteWorkers) Finish(ctx context.Context, a RemoteAttempt, o RemoteOutcome) (*task.Task, Outcome, error) {
	if len(o.Log) > RemoteMaxLogLines {
		return nil, "", fmt.Errorf("%w: log: more than %d lines", task.ErrInvalid, RemoteMaxLogLines)
	}
	if o.Outcome == OutcomeSucceeded && len(o.Result) > 0 {
		if err := task.ValidateResult(o.Result); err != nil {
			return nil, "", err
		}
	}
	h := a.holder()
	var write func(t *task.Task, ended time.Time) error
	switch o.Outcome {
	case OutcomeSucceeded:
		write = func(t *task.Task, ended time.Time) error { return t.Succeed(h, ended) }
	case OutcomeFailed:
		if o.Error == "" {
			return nil, "", fmt.Errorf("%w: error: must say why the attempt failed", task.ErrInvalid)
		}
		write = func(t *task.Task, ended time.Time) error {
			failures := t.CountWorkers(ended).Unexpected + 1
			return t.Fail(h, o.Error, ended.Add(r.cfg.RetryPolicy(failures, errors.New(o.Error))), ended)
		}
	case OutcomeSnoozed:
		if o.Snooze < 0 || o.Snooze > 366*24*time.Hour {
			return nil, "", fmt.Errorf("%w: snooze_ms: must be 0 to a year", task.ErrInvalid)
		}
		write = func(t *task.Task, ended time.Time) error { return t.Snooze(h, ended.Add(o.Snooze), ended) }
	case OutcomeReleased:
		write = func(t *task.Task, ended time.Time) error { return t.Release(h, ended) }
	default:
		return nil, "", fmt.Errorf("%w: outcome: must be succeeded, failed, snoozed or released, not %q", task.ErrInvalid, o.Outcome)
	}
	ren, err := r.renewer(ctx, a)
	if err != nil {
		return nil, "", err
	}
	ended := r.cfg.Store.Now()
	if i := ren.Doc().Entry(h); !ren.Doc().Attempts[i].Live(ended) {
		return nil, "", fmt.Errorf("task %s attempt %d: lease expired: %w", a.Key, a.Attempt, task.ErrLeaseLost)
	}
	// Locks before the outcome, whose change event wakes their waiters
	// (as run does); slots are never given back early.
	rules := claimRules{store: r.cfg.Store, logger: r.cfg.Logger, slots: &r.slots}
	if keys := ren.Doc().LockKeys; len(keys) > 0 {
		rules.releaseLocks(task.LockParams{Keys: keys, Holder: h, Now: ended})
	}
	running := ren.Doc()
	err = ren.Write(ctx, func(t *task.Task) error {
		appendLog(t, h, o.Log, ended)
		if o.Outcome == OutcomeSucceeded && len(o.Result) > 0 {
			if i := t.Entry(h); i >= 0 {
				t.Record(h, task.Output{Result: o.Result, Log: t.Attempts[i].Log, LogDropped: t.Attempts[i].LogDropped})
			}
		}
		return write(t, ended)
	})
	if err != nil {
		return nil, "", err
	}
	rules.releaseSlots(running, h) // after the outcome: concurrency.go
	doc := ren.Doc()
	out := o.Outcome
	if out == OutcomeFailed && !doc.State.Finished() {
		out = OutcomeRetried
	}
	traceAttempt(ctx, running, h, o, out, ended)
	if doc.State.Finished() && r.cfg.Finished != nil {
		// The outcome is written: tell whoever waits on it even if the
		// caller hangs up now.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishedTimeout)
		r.cfg.Finished(fctx, doc)
		cancel()
	}
	return doc, out, nil
}

// finishedTimeout bounds RemoteConfig.Finished's call after a finish.
const finishedTimeout = 30 * time.Second

// traceAttempt records the span of a remote attempt that ended as out,
// as a Go worker's run records its own (tracing.StartRun): the remote
// process has no tracer of leasepool's, so the server that writes the
// outcome records the span, from the attempt's start as stored (the
// store's clock, moved to this host's) to now.
func traceAttempt(ctx context.Context, running *task.Task, h task.Holder, o RemoteOutcome, out Outcome, ended time.Time) {
	if !tracing.On() {
		return
	}
	i := running.Entry(h)
	if i < 0 {
		return
	}
	now := time.Now()
	_, span := tracing.StartRun(ctx, tracing.Run{
		Kind: running.Kind, Key: running.Key, WorkerID: h.WorkerID, Attempt: h.Attempt, Wait: -1,
		Started:     now.Add(-ended.Sub(running.Attempts[i].StartedAt)),
		Traceparent: running.Trace.Traceparent, Tracestate: running.Trace.Tracestate,
	})
	span.SetAttributes(tracing.String("leasepool.outcome", string(out)))
	var err error
	if o.Outcome == OutcomeFailed {
		err = errors.New(o.Error)
	}
	span.EndAt(err, now)
}
