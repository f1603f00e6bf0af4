package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/internal/jsoncheck"
	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// Errors of Signal, besides ErrNotFound (no such flow) and ErrFinished (the
// flow is not pending or running: finished, or rolling back, when no
// signal step can start any more).
var (
	// ErrStepNotFound: the flow has no step of that name.
	ErrStepNotFound = errors.New("flow step not found")
	// ErrNotSignalStep: the step is not of type signal.
	ErrNotSignalStep = errors.New("not a signal step")
	// ErrAlreadySignalled: the step has its signal already, or its wait
	// ended (timed out, or cancelled).
	ErrAlreadySignalled = errors.New("step already signalled")
)

// Signal sends step of flow key its signal, with payload (a JSON value,
// or nothing: null) as the step's result in the shared parameters. It is
// a compare-and-set on the flow document: it holds no lease and needs no
// worker. A step not started yet keeps the signal and ends as soon as it
// starts. A step takes one signal: a second is refused with
// ErrAlreadySignalled, so a sender that retries after an error it cannot
// read learns whether its first one landed (Get shows the payload kept).
func Signal(ctx context.Context, s task.Store, key, step string, payload json.RawMessage) (_ *Flow, err error) {
	if len(payload) > 0 {
		if err := jsoncheck.Body(payload); err != nil {
			return nil, err
		}
		if err := task.ValidateJSON("payload", payload, task.MaxJSONDepth); err != nil {
			return nil, err
		}
		if !json.Valid(payload) {
			return nil, invalid("payload", "is not valid JSON")
		}
	}
	cur, err := Get(ctx, s, key)
	if err != nil {
		return nil, err
	}
	// The signal is an event of the flow's trace, whoever sent it.
	sctx, span := tracing.StartInternal(tracing.Extract(ctx, cur.Trace.Traceparent, cur.Trace.Tracestate), "flow signal",
		tracing.String("messaging.system", tracing.System), tracing.String("leasepool.flow.key", key), tracing.String("leasepool.flow.step", step))
	defer func() { span.End(err) }()
	ctx = sctx
	f, err := modify(ctx, s, key, func(f *Flow) error { return f.signal(step, payload, s.Now().UTC()) })
	if err != nil {
		return f, err
	}
	return f, follow(ctx, s, f)
}

func (f *Flow) signal(name string, payload json.RawMessage, at time.Time) error {
	i := f.stepIndex(name)
	switch {
	case i < 0:
		return fmt.Errorf("flow %s: step %.80q: %w", f.Key, name, ErrStepNotFound)
	case f.Steps[i].StepType() != TypeSignal:
		return fmt.Errorf("flow %s: step %s is a %s step: %w", f.Key, name, f.Steps[i].StepType(), ErrNotSignalStep)
	case f.State != StatePending && f.State != StateRunning:
		return fmt.Errorf("signal %s/%s: %w (it is %s)", f.Key, name, ErrFinished, f.State)
	}
	p := &f.Progress[i]
	switch {
	case p.Signal != nil:
		return fmt.Errorf("signal %s/%s: %w at %s", f.Key, name, ErrAlreadySignalled, p.Signal.At.Format(time.RFC3339Nano))
	case p.Do.State != RunNone && p.Do.State != RunActive:
		return fmt.Errorf("signal %s/%s: %w: its wait ended (%s)", f.Key, name, ErrAlreadySignalled, p.Do.State)
	}
	if paramsSize(f.Params)+len(name)+len(payload) > MaxParamsSize {
		return invalid("payload", fmt.Sprintf("of %d bytes does not fit: the shared parameters would pass %d bytes", len(payload), MaxParamsSize))
	}
	p.Signal = &Received{At: at, Payload: payload}
	if p.Do.State == RunActive {
		f.stopTask(p.Do.Task) // the timeout's timer
		p.Do.State, p.Do.EndedAt = RunSucceeded, at
		f.setResult(i, payload)
		f.ended(i)
		f.advance(at)
	}
	return nil
}
