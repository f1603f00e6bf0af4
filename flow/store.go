package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// A flow is a document (task.Document) in Namespace, its id the flow's
// key: PutDocument's compare-and-set on version is what a flow needs to
// move (records have no compare-and-set: a put only wins by its time).
const Namespace = "leasepool.flow"

// A flow stored before flows became documents is a task keyed
// legacyPrefix + flow key, its payload the flow. adopt moves it into a
// document on first use and leaves the task cancelled and marked moved,
// for task retention to delete.
const (
	legacyPrefix = task.ReservedPrefix + "flow:"
	legacyKind   = "leasepool.flow"
)

// movedMarker is a legacy task's payload once its flow is a document.
var movedMarker = json.RawMessage(`{"moved_to":"` + Namespace + `"}`)

// errUnchanged leaves a document as it was.
var errUnchanged = errors.New("flow unchanged")

// decode reads document d: a flow in one document (the caller's to
// change), or a split flow's head and the parts it names (shared: see
// split.go; Get and modify clone it).
func decode(ctx context.Context, s task.Store, d task.Document) (*Flow, error) {
	var h headDoc
	if err := json.Unmarshal(d.Value, &h); err != nil {
		return nil, fmt.Errorf("flow document %s: %w", d.ID, err)
	}
	f := &h.Flow
	if f.Key != d.ID {
		return nil, fmt.Errorf("flow document %s: holds flow %q", d.ID, f.Key)
	}
	if h.Split != nil {
		return decodeSplit(ctx, s, d, &h)
	}
	f.Steps, f.Progress, f.Params = h.Steps, h.Progress, h.Params
	if len(f.Progress) != len(f.Steps) {
		return nil, fmt.Errorf("flow document %s: %d steps but %d progress entries", d.ID, len(f.Steps), len(f.Progress))
	}
	f.Version = d.Version
	// Each step's summary as this version reads its runs, whenever the
	// document was written.
	f.summarise()
	return f, nil
}

// read reads the flow of key for a caller that only looks: a split flow
// is partCache's, shared.
func read(ctx context.Context, s task.Store, key string) (*Flow, error) {
	for {
		d, err := load(ctx, s, key)
		if err != nil {
			return nil, err
		}
		f, err := decode(ctx, s, d)
		if errors.Is(err, errPartGone) {
			continue // a newer write replaced it: read its head
		}
		return f, err
	}
}

// load reads the document of flow key, adopting a legacy one.
func load(ctx context.Context, s task.Store, key string) (task.Document, error) {
	d, err := s.GetDocument(ctx, Namespace, key)
	if errors.Is(err, task.ErrNotFound) {
		d, err = adopt(ctx, s, key)
	}
	if errors.Is(err, task.ErrNotFound) {
		return task.Document{}, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	return d, err
}

// adopt moves the legacy task of flow key, if there is one not moved yet,
// into its document, and returns the document (task.ErrNotFound: none).
func adopt(ctx context.Context, s task.Store, key string) (task.Document, error) {
	t, err := s.Get(ctx, legacyPrefix+key)
	if err != nil {
		return task.Document{}, err
	}
	if string(t.Payload) == string(movedMarker) {
		return task.Document{}, task.ErrNotFound
	}
	d, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: key, Value: t.Payload})
	if errors.Is(err, task.ErrConflict) { // adopted meanwhile
		d, err = s.GetDocument(ctx, Namespace, key)
	}
	if err != nil {
		return task.Document{}, fmt.Errorf("adopt flow %s: %w", key, err)
	}
	_, err = task.Modify(ctx, s, t.Key, func(t *task.Task) error {
		t.Payload = movedMarker
		if !t.State.Finished() {
			return t.Cancel(s.Now())
		}
		return nil
	})
	if err != nil && !errors.Is(err, task.ErrNotFound) {
		return task.Document{}, fmt.Errorf("adopt flow %s: retire its task: %w", key, err)
	}
	return d, nil
}

// adoptAll adopts every legacy flow not moved yet.
func adoptAll(ctx context.Context, s task.Store) error {
	q := task.ListQuery{Kind: legacyKind, KeyPrefix: legacyPrefix, Reserved: true, Limit: 500}
	for {
		page, err := s.List(ctx, q)
		if err != nil {
			return err
		}
		for _, t := range page {
			key, ok := strings.CutPrefix(t.Key, legacyPrefix)
			if !ok || string(t.Payload) == string(movedMarker) {
				continue
			}
			if _, err := adopt(ctx, s, key); err != nil && !errors.Is(err, task.ErrNotFound) {
				// One that cannot move must not fail every list of flows:
				// skipped, and tried again by the next list.
				task.SkipMalformed(legacyKind, t.Key, err)
			}
		}
		if len(page) < q.Limit {
			return nil
		}
		q.AfterSeq = page[len(page)-1].Seq
	}
}

// modify applies fn to the stored flow of key under compare-and-set,
// again on the newer document when another write came first. fn
// returning errUnchanged writes nothing and is no error; fn returning
// another error has changed nothing.
//
// Publish stores a new flow from spec and publishes its first step, or,
// when a flow of that key exists, leaves it as it is (flows are idempotent
// by key, like tasks) and makes sure its current step is published.
// Validation errors wrap task.ErrInvalid, name the field, and write nothing.
//
// A new flow keeps the trace context of its publish: with tracing on, the
// flow's own span (a child of ctx's), else ctx's span's, if any.
func Publish(ctx context.Context, s task.Store, spec Spec) (f *Flow, res task.PublishResult, err error) {
	if err := spec.Validate(); err != nil {
		return nil, "", err
	}
	ctx, span := tracing.StartFlow(ctx, spec.Key)
	defer func() {
		span.SetAttributes(tracing.String("leasepool.publish.result", string(res)))
		span.End(err)
	}()
	now := s.Now().UTC()
	f = &Flow{Key: spec.Key, Steps: spec.Steps, Params: map[string]json.RawMessage{}, State: StatePending,
		Gen: 1, Progress: make([]Progress, len(spec.Steps)), CreatedAt: now, UpdatedAt: now}
	f.Trace.Traceparent, f.Trace.Tracestate = tracing.Inject(ctx)
	if len(spec.Params) > 0 {
		if err := json.Unmarshal(spec.Params, &f.Params); err != nil {
			return nil, "", invalid("params", err.Error())
		}
	}
	res = task.Existing
	_, err = load(ctx, s, spec.Key)
	if errors.Is(err, ErrNotFound) {
		res = task.Inserted
		_, err = store(ctx, s, f)
		if errors.Is(err, task.ErrConflict) { // published meanwhile
			res, err = task.Existing, nil
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("flow %s: %w", spec.Key, err)
	}
	if f, err = read(ctx, s, spec.Key); err != nil {
		return nil, "", err
	}
	if f.shared {
		f = f.clone()
	}
	f, err = ensure(ctx, s, f)
	return f, res, err
}

// store writes the new flow f: one document, or, past inlineSteps steps,
// its parts and then its head. task.ErrConflict: one of its key exists.
func store(ctx context.Context, s task.Store, f *Flow) (task.Document, error) {
	if len(f.Steps) <= inlineSteps {
		b, err := json.Marshal(f)
		if err != nil {
			return task.Document{}, err
		}
		return s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: f.Key, Value: b})
	}
	b, written, err := newSplit(ctx, s, f)
	var d task.Document
	if err == nil {
		d, err = s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: f.Key, Value: b})
	}
	if err != nil {
		deleteParts(ctx, s, written)
	}
	return d, err
}

// Get returns the flow of key, or ErrNotFound.
func Get(ctx context.Context, s task.Store, key string) (*Flow, error) {
	if err := task.ValidateName("key", key); err != nil {
		return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	f, err := read(ctx, s, key)
	if err != nil {
		return nil, err
	}
	if f.shared {
		f = f.clone()
	}
	return f, nil
}

// ListQuery selects flows.
type ListQuery struct {
	// Active keeps flows still moving (pending, running, rolling back).
	Active bool
	Limit  int // 0: no limit
}

// List returns flows in publish (created_at) order. A document it cannot
// read is skipped and reported to task.SkipMalformed.
func List(ctx context.Context, s task.Store, q ListQuery) ([]*Flow, error) {
	if err := adoptAll(ctx, s); err != nil {
		return nil, err
	}
	docs, err := s.Documents(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	var out []*Flow
	for _, d := range docs {
		if q.Active && finishedHead(d) {
			continue // not reading a split flow's parts to leave it out
		}
		f, err := decode(ctx, s, d)
		if errors.Is(err, errPartGone) {
			f, err = read(ctx, s, d.ID)
		}
		if f != nil && f.shared {
			f = f.clone()
		}
		if err != nil {
			// One unreadable document must not fail every list of flows
			// (the API, the dashboard, flow ls, /metrics).
			task.SkipMalformed(Namespace, fmt.Sprintf("%s@%d", d.ID, d.Version), err)
			continue
		}
		if !q.Active || !f.State.Finished() {
			out = append(out, f)
		}
	}
	slices.SortStableFunc(out, func(a, b *Flow) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

// headFields are the fields of a flow's document that say whether it
// stopped, read without a split flow's parts.
type headFields struct {
	Key       string    `json:"key"`
	State     State     `json:"state"`
	UpdatedAt time.Time `json:"updated_at"`
	Split     *split    `json:"split"`
}

// finishedHead reports whether document d holds a flow that stopped.
func finishedHead(d task.Document) bool {
	var h headFields
	return json.Unmarshal(d.Value, &h) == nil && h.State.Finished()
}

// DeleteStopped deletes the documents of flows that stopped (Finished)
// before before, at most limit of them, and returns how many. A flow
// retried since it was read is not deleted (compare-and-set on version).
// A split flow's parts go with it, and any a write that died left.
func DeleteStopped(ctx context.Context, s task.Store, before time.Time, limit int) (int, error) {
	docs, err := s.Documents(ctx, Namespace)
	if err != nil {
		return 0, err
	}
	n := 0
	var gone []string // split flows deleted: key~token~
	for _, d := range docs {
		if n >= limit {
			break
		}
		var h headFields
		if json.Unmarshal(d.Value, &h) != nil || h.Key != d.ID || !h.State.Finished() || !h.UpdatedAt.Before(before) {
			continue
		}
		err = s.DeleteDocument(ctx, Namespace, d.ID, d.Version)
		switch {
		case err == nil:
			n++
			if h.Split != nil {
				gone = append(gone, d.ID+"~"+h.Split.Token+"~")
			}
		case errors.Is(err, task.ErrConflict), errors.Is(err, task.ErrNotFound):
		default:
			return n, err
		}
	}
	if len(gone) > 0 {
		parts, err := s.Documents(ctx, PartNamespace)
		if err != nil {
			return n, err
		}
		var ids []string
		for _, p := range parts {
			if slices.ContainsFunc(gone, func(prefix string) bool { return strings.HasPrefix(p.ID, prefix) }) {
				ids = append(ids, p.ID)
			}
		}
		deleteParts(ctx, s, ids)
	}
	return n, nil
}

// Cancel stops the flow of key: the tasks of the running steps are
// cancelled (their handlers stop at their next ping), signal and sleep
// steps stop waiting, and with rollback the started steps are rolled back
// (see the rules in engine.go); without, the flow is cancelled.
func Cancel(ctx context.Context, s task.Store, key string, rollback bool) (*Flow, error) {
	f, err := modify(ctx, s, key, func(f *Flow) error { return f.cancel(rollback, s.Now().UTC()) })
	if errors.Is(err, ErrFinished) && f != nil && f.State == StateCancelled {
		// Cancelled already, perhaps by a cancel whose task stops failed:
		// stop the cancelled runs' tasks again (stopping twice is harmless).
		for _, p := range f.Progress {
			for _, r := range []Run{p.Do, p.Undo} {
				if r.State == RunCancelled {
					_ = stopTask(ctx, s, r.Task)
				}
			}
		}
	}
	if err != nil {
		return f, err
	}
	if err := follow(ctx, s, f); err != nil {
		return f, err
	}
	return ensure(ctx, s, f)
}

// Retry runs a failed, rolled-back or cancelled flow again, as a new run
// generation (new step task keys): every step whose work does not stand
// runs again once its needs have succeeded; after a full rollback, all.
func Retry(ctx context.Context, s task.Store, key string) (*Flow, error) {
	f, err := modify(ctx, s, key, func(f *Flow) error { return f.retry(s.Now().UTC()) })
	if err != nil {
		return f, err
	}
	if err := follow(ctx, s, f); err != nil {
		return f, err
	}
	return f, nil
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
