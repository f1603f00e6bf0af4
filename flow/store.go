package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// A flow document lives in the tasks table, as the payload of a task that
// no worker can claim: Store.Update's compare-and-set on version is what a
// flow needs to move (records have no compare-and-set: a put only wins by
// its time). While the flow moves the task is pending and pinned to a
// worker id that nothing registers; once the flow stops it is cancelled,
// so task retention deletes it with the flow's step tasks.
const (
	// DocPrefix starts the key of a flow's document: DocPrefix + flow key.
	// The leasepool: prefix is reserved (no task events are derived).
	DocPrefix = "leasepool:flow:"
	// DocKind is the documents' kind; no worker registers it.
	DocKind = "leasepool.flow"
	// docPin pins the documents to a worker id that never claims.
	docPin = "leasepool:flow-documents"
)

// DocKey is the task key of flow key's document.
func DocKey(key string) string { return DocPrefix + key }

// errUnchanged leaves a document as it was.
var errUnchanged = errors.New("flow unchanged")

func decode(t *task.Task) (*Flow, error) {
	var f Flow
	if err := json.Unmarshal(t.Payload, &f); err != nil {
		return nil, fmt.Errorf("flow document %s: %w", t.Key, err)
	}
	if len(f.Progress) != len(f.Steps) {
		return nil, fmt.Errorf("flow document %s: %d steps but %d progress entries", t.Key, len(f.Steps), len(f.Progress))
	}
	f.Version = t.Version
	return &f, nil
}

// modify applies fn to the stored flow of key under compare-and-set. fn
// returning errUnchanged writes nothing and is no error.
func modify(ctx context.Context, s task.Store, key string, fn func(f *Flow) error) (*Flow, error) {
	var out *Flow
	doc, err := task.Modify(ctx, s, DocKey(key), func(t *task.Task) error {
		f, err := decode(t)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			out = f
			return err
		}
		now := s.Now()
		f.UpdatedAt = now.UTC()
		b, err := json.Marshal(f)
		if err != nil {
			return err
		}
		t.Payload = b
		t.UpdatedAt = now.UTC()
		switch {
		case f.State.Finished() && !t.State.Finished():
			err = t.Cancel(now)
		case !f.State.Finished() && t.State.Finished():
			err = t.Reset(now)
		}
		out = f
		return err
	})
	switch {
	case errors.Is(err, errUnchanged):
		return out, nil
	case errors.Is(err, task.ErrNotFound):
		return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
	case err != nil:
		return out, err
	}
	out.Version = doc.Version
	return out, nil
}

// Publish stores a new flow from spec and publishes its first step, or,
// when a flow of that key exists, leaves it as it is (flows are idempotent
// by key, like tasks) and makes sure its current step is published.
// Validation errors wrap task.ErrInvalid, name the field, and write nothing.
func Publish(ctx context.Context, s task.Store, spec Spec) (*Flow, task.PublishResult, error) {
	if err := spec.Validate(); err != nil {
		return nil, "", err
	}
	now := s.Now().UTC()
	f := &Flow{Key: spec.Key, Steps: spec.Steps, Params: map[string]json.RawMessage{}, State: StatePending,
		Gen: 1, Progress: make([]Progress, len(spec.Steps)), CreatedAt: now, UpdatedAt: now}
	if len(spec.Params) > 0 {
		if err := json.Unmarshal(spec.Params, &f.Params); err != nil {
			return nil, "", invalid("params", err.Error())
		}
	}
	b, err := json.Marshal(f)
	if err != nil {
		return nil, "", err
	}
	// The document's key is under task.ReservedPrefix: the spec's key was
	// validated as a user's, so only this write may create it.
	doc, res, err := task.Publish(task.WithInternalWrite(ctx), s, task.PublishParams{Key: DocKey(spec.Key), Kind: DocKind, Payload: b,
		Options: task.Options{SpecificWorkerIDs: []string{docPin}}})
	if err != nil {
		return nil, "", fmt.Errorf("flow %s: %w", spec.Key, err)
	}
	if f, err = decode(doc); err != nil {
		return nil, "", err
	}
	f, err = ensure(ctx, s, f)
	return f, res, err
}

// Get returns the flow of key, or ErrNotFound.
func Get(ctx context.Context, s task.Store, key string) (*Flow, error) {
	doc, err := s.Get(ctx, DocKey(key))
	if errors.Is(err, task.ErrNotFound) {
		return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return decode(doc)
}

// ListQuery selects flows.
type ListQuery struct {
	// Active keeps flows still moving (pending, running, rolling back).
	Active bool
	Limit  int // 0: no limit
}

// List returns flows in publish order. A document it cannot read is
// skipped and reported to task.SkipMalformed.
func List(ctx context.Context, s task.Store, q ListQuery) ([]*Flow, error) {
	lq := task.ListQuery{Kind: DocKind, Reserved: true, Limit: 500}
	if q.Active {
		lq.State = task.StatePending
	}
	var out []*Flow
	for {
		page, err := s.List(ctx, lq)
		if err != nil {
			return nil, err
		}
		for _, t := range page {
			if !strings.HasPrefix(t.Key, DocPrefix) {
				continue
			}
			f, err := decode(t)
			if err != nil {
				// One unreadable document must not fail every list of
				// flows (the API, the dashboard, flow ls, /metrics).
				task.SkipMalformed(DocKind, fmt.Sprintf("%s@%d", t.Key, t.Version), err)
				continue
			}
			if out = append(out, f); q.Limit > 0 && len(out) >= q.Limit {
				return out, nil
			}
		}
		if len(page) < lq.Limit {
			return out, nil
		}
		lq.AfterSeq = page[len(page)-1].Seq
	}
}

// Cancel stops the flow of key: the running step's task is cancelled (its
// handler stops at its next ping), and with rollback the started steps are
// rolled back from that one, in reverse; without, the flow is cancelled.
func Cancel(ctx context.Context, s task.Store, key string, rollback bool) (*Flow, error) {
	var stop string
	f, err := modify(ctx, s, key, func(f *Flow) error {
		var err error
		stop, err = f.cancel(rollback, s.Now().UTC())
		return err
	})
	if errors.Is(err, ErrFinished) && f != nil && f.State == StateCancelled {
		// Cancelled already, perhaps by a cancel whose task stop failed:
		// stop the step's task again (stopping twice is harmless).
		_ = stopTask(ctx, s, f.Progress[f.Cursor].Do.Task)
	}
	if err != nil {
		return f, err
	}
	if err := stopTask(ctx, s, stop); err != nil {
		return f, err
	}
	return ensure(ctx, s, f)
}

// Retry runs a failed, rolled-back or cancelled flow again from the first
// step whose work does not stand (after a full rollback, the first), as a
// new run generation: new step task keys.
func Retry(ctx context.Context, s task.Store, key string) (*Flow, error) {
	f, err := modify(ctx, s, key, func(f *Flow) error { return f.retry(s.Now().UTC()) })
	if err != nil {
		return f, err
	}
	return ensure(ctx, s, f)
}

// stopTask cancels a step's task; one already finished or gone is fine.
func stopTask(ctx context.Context, s task.Store, key string) error {
	if key == "" {
		return nil
	}
	_, err := task.Cancel(ctx, s, key)
	if err == nil || errors.Is(err, task.ErrFinished) || errors.Is(err, task.ErrNotFound) {
		return nil
	}
	return fmt.Errorf("cancel step task %s: %w", key, err)
}
