package task

import (
	"context"
	"errors"
	"fmt"
)

// PublishResult says what a publish did.
type PublishResult string

const (
	Inserted PublishResult = "inserted" // a new task
	Rerun    PublishResult = "rerun"    // a finished task was reset to run again
	Existing PublishResult = "existing" // left as it was
)

// Publish is the idempotent publish: insert p as a new task, or leave the
// existing task of that key alone, or, when p.Rerun is set and it is
// finished, reset it so it runs again. A running task is never reset.
// Validation errors wrap ErrInvalid and nothing is written.
func Publish(ctx context.Context, s Store, p PublishParams) (*Task, PublishResult, error) {
	t, err := NewTask(p, s.Now())
	if err != nil {
		return nil, "", err
	}
	stored, inserted, err := s.Insert(ctx, t)
	if err != nil {
		return nil, "", fmt.Errorf("publish %s: %w", p.Key, err)
	}
	if inserted {
		return stored, Inserted, nil
	}
	if !p.Rerun {
		return stored, Existing, nil
	}
	for {
		if !stored.State.Finished() {
			return stored, Existing, nil
		}
		next := stored.Clone()
		if err := next.Reset(s.Now()); err != nil {
			return nil, "", err
		}
		err := s.Update(ctx, next)
		if err == nil {
			return next, Rerun, nil
		}
		if !errors.Is(err, ErrConflict) {
			return nil, "", fmt.Errorf("publish %s: rerun: %w", p.Key, err)
		}
		if stored, err = s.Get(ctx, p.Key); err != nil {
			return nil, "", fmt.Errorf("publish %s: %w", p.Key, err)
		}
	}
}

// Modify applies fn to the current document of key and writes it with
// compare-and-set, re-reading and re-applying on conflict. An error from fn
// stops it and is returned as is.
func Modify(ctx context.Context, s Store, key string, fn func(t *Task) error) (*Task, error) {
	for {
		cur, err := s.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		next := cur.Clone()
		if err := fn(next); err != nil {
			return cur, err
		}
		err = s.Update(ctx, next)
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, ErrConflict) {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
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
