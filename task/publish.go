package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/leasepool/leasepool/internal/tracing"
)

// PublishResult says what a publish did.
type PublishResult string

const (
	Inserted PublishResult = "inserted" // a new task
	Rerun    PublishResult = "rerun"    // a finished task was reset to run again
	Existing PublishResult = "existing" // left as it was
	// Debounced: a pending task, never claimed, took the publish's
	// payload and a later run_at (PublishParams.Debounce).
	Debounced PublishResult = "debounced"
)

// Publish is the idempotent publish: insert p as a new task, or leave the
// existing task of that key alone, or, when p.Rerun is set and it is
// finished, reset it so it runs again. A running task is never reset.
// With p.Debounce, a task of that key that is pending and was never
// claimed takes p's payload and runs p.Debounce from now (Debounced).
// Validation errors wrap ErrInvalid and nothing is written: p is checked
// as Validate does, unless ctx comes from WithInternalWrite.
//
// The task keeps a trace context (Task.Trace): with tracing on, that of
// the publish's own span, a child of p.Trace or else of ctx's span; with
// it off, p.Trace or ctx's span's.
func Publish(ctx context.Context, s Store, p PublishParams) (t *Task, res PublishResult, err error) {
	if p.Trace.IsZero() {
		p.Trace.Traceparent, p.Trace.Tracestate = tracing.Inject(ctx)
	} else if tracing.On() {
		ctx = tracing.Extract(ctx, p.Trace.Traceparent, p.Trace.Tracestate)
	}
	if tracing.On() {
		var span *tracing.Span
		ctx, span = tracing.StartPublish(ctx, p.Kind, p.Key)
		defer func() {
			span.SetAttributes(tracing.String("leasepool.publish.result", string(res)))
			span.End(err)
		}()
		p.Trace.Traceparent, p.Trace.Tracestate = tracing.Inject(ctx)
	}
	t, err = newTask(p, s.Now(), isInternalWrite(ctx))
	if err != nil {
		return nil, "", err
	}
	if p.Debounce > 0 {
		// A burst publishes a key that mostly exists: read it first, so
		// that each publish of the burst costs one write (the debounce's),
		// not a refused insert as well.
		stored, err := s.Get(ctx, p.Key)
		switch {
		case err == nil && stored.Debounceable():
			return debounce(ctx, s, p, t, stored)
		case err != nil && !errors.Is(err, ErrNotFound):
			return nil, "", fmt.Errorf("publish %s: %w", p.Key, err)
		}
	}
	stored, inserted, err := s.Insert(ctx, t)
	if err != nil {
		return nil, "", fmt.Errorf("publish %s: %w", p.Key, err)
	}
	if inserted {
		return stored, Inserted, nil
	}
	if p.Debounce > 0 && stored.Debounceable() {
		return debounce(ctx, s, p, t, stored)
	}
	if !p.Rerun {
		return stored, Existing, nil
	}
	next, err := ModifyFrom(ctx, s, p.Key, stored, func(t *Task) error {
		if err := t.Reset(s.Now()); err != nil {
			return err
		}
		if !p.Trace.IsZero() {
			t.Trace = p.Trace // the rerun's attempts continue the rerun's trace
		}
		if p.Debounce > 0 {
			// A rerun of a debounced publish runs the new payload, after
			// the same quiet period a first publish waits.
			t.Payload = slices.Clone(p.Payload)
			if len(t.Payload) == 0 {
				t.Payload = json.RawMessage("{}")
			}
			if at := clampTime(p.debounceRunAt(s.Now())); at.After(t.RunAt) {
				t.RunAt = at.UTC()
				t.touch(s.Now())
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrNotFinished):
		return next, Existing, nil // running: never reset
	case err != nil:
		return nil, "", fmt.Errorf("publish %s: rerun: %w", p.Key, err)
	}
	return next, Rerun, nil
}

// debounce writes a debounced publish into stored, the pending task of
// p.Key that Insert found, built as the insert would have been (fresh).
// The write is the store's compare-and-set on stored's version: a claim
// in between bumped the version, so the write conflicts, the task is
// read again, and a claimed one is left as it is (Existing): a claimed
// task's payload never changes.
func debounce(ctx context.Context, s Store, p PublishParams, fresh, stored *Task) (*Task, PublishResult, error) {
	next, err := ModifyFrom(ctx, s, p.Key, stored, func(t *Task) error {
		return t.Debounce(fresh.Payload, fresh.Trace, p.debounceRunAt(s.Now()), s.Now())
	})
	switch {
	case errors.Is(err, errClaimed):
		return next, Existing, nil
	case err != nil:
		return nil, "", fmt.Errorf("publish %s: debounce: %w", p.Key, err)
	}
	return next, Debounced, nil
}

// Modify applies fn to the stored document of key and writes it with
// compare-and-set; see ModifyFrom.
func Modify(ctx context.Context, s Store, key string, fn func(t *Task) error) (*Task, error) {
	return ModifyFrom(ctx, s, key, nil, fn)
}

// ModifyFrom is the one compare-and-set loop every write to a task goes
// through. It applies fn to a copy of cur (the document of key read or
// written earlier, so a current cache costs no read; nil reads it) and
// writes it; on a version conflict it re-reads the task and applies fn
// again. It returns the document written, or, when fn fails, fn's error as
// is with the document fn was given.
func ModifyFrom(ctx context.Context, s Store, key string, cur *Task, fn func(t *Task) error) (*Task, error) {
	for {
		if cur == nil {
			var err error
			if cur, err = s.Get(ctx, key); err != nil {
				return nil, err
			}
		}
		next := cur.Clone()
		if err := fn(next); err != nil {
			return cur, err
		}
		err := s.Update(ctx, next)
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, ErrConflict) {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cur = nil
	}
}

// Cancel cancels the task of key from anywhere.
func Cancel(ctx context.Context, s Store, key string) (*Task, error) {
	return Modify(ctx, s, key, func(t *Task) error { return t.Cancel(s.Now()) })
}

// Retry resets a failed, cancelled or succeeded task so it runs again.
func Retry(ctx context.Context, s Store, key string) (*Task, error) {
	return Modify(ctx, s, key, func(t *Task) error { return t.Reset(s.Now()) })
}
