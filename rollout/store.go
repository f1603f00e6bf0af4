// Reading rollouts, creating them, and the operators' writes.

package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// Errors callers branch on with errors.Is.
var (
	// ErrNotFound: no rollout of that name (it wraps task.ErrNotFound).
	ErrNotFound = fmt.Errorf("rollout %w", task.ErrNotFound)
	// ErrExists: Create of a name already taken.
	ErrExists = errors.New("rollout exists")
	// ErrState: the rollout's state does not allow the operation.
	ErrState = errors.New("rollout state does not allow it")
)

// Get returns the rollout named name with every execution (Devices),
// read from its shards. Readers of the aggregates alone use GetHead.
func Get(ctx context.Context, ds task.DocumentStore, name string) (*Rollout, error) {
	r, err := GetHead(ctx, ds, name)
	if err != nil {
		return nil, err
	}
	if err := load(ctx, ds, r, nil); err != nil {
		return nil, err
	}
	return r, nil
}

func decode(d task.Document) (*Rollout, error) {
	var r Rollout
	if err := json.Unmarshal(d.Value, &r); err != nil {
		return nil, fmt.Errorf("rollout %s: %w", d.ID, err)
	}
	r.Name, r.Version = d.ID, d.Version
	if r.ShardKey == "" {
		// Stored before shards: the executions are in the document.
		var legacy struct {
			Devices []Exec `json:"devices"`
		}
		if err := json.Unmarshal(d.Value, &legacy); err != nil {
			return nil, fmt.Errorf("rollout %s: %w", d.ID, err)
		}
		r.Devices = legacy.Devices
		r.tally()
	}
	return &r, nil
}

// List returns every rollout, newest first, without executions (as
// GetHead). A malformed document is skipped (task.SkipMalformed).
func List(ctx context.Context, ds task.DocumentStore) ([]*Rollout, error) {
	docs, err := ds.Documents(ctx, Namespace)
	if err != nil {
		return nil, err
	}
	out := make([]*Rollout, 0, len(docs))
	for _, d := range docs {
		r, err := decode(d)
		if err != nil {
			task.SkipMalformed(Namespace, d.ID, err)
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Rollout) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// put writes r by compare-and-set on r.Version.
func put(ctx context.Context, ds task.DocumentStore, r *Rollout) error {
	for i := range r.Events {
		if r.Events[i].Version == 0 {
			// Added since the last write: this write's, which the event
			// stream tells apart by it (events.Follow).
			r.Events[i].Version = r.Version + 1
		}
	}
	r.bound()
	if err := putShards(ctx, ds, r); err != nil {
		return err
	}
	value, err := encode(r)
	if err != nil {
		return err
	}
	d, err := ds.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: r.Name, Version: r.Version, Value: value})
	if err != nil {
		return err
	}
	r.Version = d.Version
	return nil
}

// Store is what rollouts need of a task.Store: documents, tasks and the
// store's clock. Every task.Store is one.
type Store = task.Store

// Create makes rollout name from spec: it checks both, resolves the
// devices (spec.Select against the inventory, or spec.Devices), splits them
// into waves, and stores the rollout running; a driver starts its first
// wave. Nothing is written on an error.
//
// The rollout keeps the trace context of its creation: with tracing on,
// the rollout's own span (a child of ctx's), else ctx's span's, if any.
func Create(ctx context.Context, st Store, name string, spec Spec) (_ *Rollout, err error) {
	r, err := DryRun(ctx, st, name, spec)
	if err != nil {
		return nil, err
	}
	ctx, span := tracing.StartRollout(ctx, name)
	defer func() { span.End(err) }()
	r.Trace.Traceparent, r.Trace.Tracestate = tracing.Inject(ctx)
	if err := put(ctx, st, r); err != nil {
		// Its shards, under a key of this creation's, are no one's.
		_ = deleteShards(context.WithoutCancel(ctx), st, r)
		if errors.Is(err, task.ErrConflict) {
			return nil, fmt.Errorf("%s: %w", name, ErrExists)
		}
		return nil, err
	}
	return r, nil
}

// DryRun is Create but for the write: the rollout Create would store, its
// devices resolved and split into waves (Rollout.Plan), or the error
// Create would return. It only reads the store.
func DryRun(ctx context.Context, st Store, name string, spec Spec) (*Rollout, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	devices := slices.Clone(spec.Devices)
	var excluded []string
	if spec.Select != "" {
		sel, _ := mqttdev.ParseSelector(spec.Select)
		picked, err := mqttdev.Select(ctx, st, sel)
		if err != nil {
			return nil, err
		}
		// A device nobody vouched for is never a target.
		devices, excluded = picked.Devices, picked.New
		if len(devices) == 0 {
			return nil, invalid("select", "%q matches no vouched device in the inventory%s", spec.Select, newDevices(excluded))
		}
		if len(devices) > MaxDevices {
			return nil, invalid("select", "%q matches %d devices, more than %d", spec.Select, len(devices), MaxDevices)
		}
	}
	slices.Sort(devices)
	if len(spec.Devices) > MaxSpecDevices {
		// They are the executions' devices: not kept twice.
		spec.Devices = nil
	}
	spec.Args, spec.RollbackArgs = compactArgs(spec.Args), compactArgs(spec.RollbackArgs)
	if len(spec.Waves) == 0 {
		spec.Waves = []WaveTarget{{Percent: 100}}
	}
	now := st.Now().UTC()
	r := &Rollout{Name: name, Spec: spec, State: StateRunning, CreatedAt: now, UpdatedAt: now}
	start := 0
	for i, t := range spec.Waves {
		end := t.Count
		if t.Percent > 0 {
			end = int(math.Ceil(t.Percent * float64(len(devices)) / 100))
		}
		end = min(end, len(devices))
		if end < start {
			return nil, invalid("waves", "wave %d: %s is %d of the %d devices, below the previous target's %d (targets are cumulative and must not go down)",
				i+1, t, end, len(devices), start)
		}
		if end == start {
			continue // adds no device
		}
		gate := GateAuto
		if spec.ApproveWaves && len(r.Waves) > 0 {
			gate = GateApproval
		}
		r.Waves = append(r.Waves, Wave{Target: t, Start: start, End: end, Gate: gate})
		for _, d := range devices[start:end] {
			r.Devices = append(r.Devices, Exec{Device: d, Wave: len(r.Waves) - 1})
		}
		start = end
	}
	r.event(now, EventCreated, fmt.Sprintf("%d devices in %d waves%s", len(devices), len(r.Waves), newDevices(excluded)))
	if err := r.checkSize(); err != nil {
		return nil, err
	}
	if err := checkKeysFree(ctx, st, name); err != nil {
		return nil, err
	}
	return r, nil
}

// checkKeysFree refuses name when it is taken, or when a task holds one
// of its keys ("rollout:NAME:..."): a rollout of that name deleted (its
// tasks stay until retention deletes them), or a task published under
// it, would otherwise stand for one of the new rollout's executions.
func checkKeysFree(ctx context.Context, st Store, name string) error {
	if _, err := st.GetDocument(ctx, Namespace, name); err == nil {
		return fmt.Errorf("%s: %w", name, ErrExists)
	} else if !errors.Is(err, task.ErrNotFound) {
		return err
	}
	held, err := st.List(ctx, task.ListQuery{KeyPrefix: "rollout:" + name + ":", Limit: 1})
	if err != nil {
		return err
	}
	if len(held) > 0 {
		return fmt.Errorf("%s: %w: task %s holds one of its keys (a deleted rollout's of that name, or one published under it): choose another name",
			name, ErrExists, held[0].Key)
	}
	return nil
}

// newDevices says which devices a selection left out as new, the first
// ten by name.
func newDevices(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	const shown = 10
	names := strings.Join(ids[:min(len(ids), shown)], ", ")
	if len(ids) > shown {
		names += fmt.Sprintf(" and %d more", len(ids)-shown)
	}
	what := "new devices"
	if len(ids) == 1 {
		what = "new device"
	}
	return fmt.Sprintf("; %d %s left out, not vouched for (leasepool device approve): %s", len(ids), what, names)
}

// event appends an event, keeping the last MaxEvents.
func (r *Rollout) event(at time.Time, typ, detail string) {
	r.EventSeq++
	r.Events = append(r.Events, Event{Seq: r.EventSeq, Type: typ, At: at, Wave: r.Wave, Detail: detail})
	if n := len(r.Events) - MaxEvents; n > 0 {
		r.Events = slices.Delete(r.Events, 0, n)
	}
}

// errNoChange ends an update that has nothing to write.
var errNoChange = errors.New("no change")

// update applies fn to rollout name by compare-and-set, reading again on
// a conflict, and returns the rollout as stored.
func update(ctx context.Context, st Store, name string, fn func(r *Rollout, now time.Time) error) (*Rollout, error) {
	for {
		r, err := Get(ctx, st, name)
		if err != nil {
			return nil, err
		}
		now := st.Now().UTC()
		switch err := fn(r, now); {
		case errors.Is(err, errNoChange):
			return r, nil
		case err != nil:
			return nil, fmt.Errorf("rollout %s: %w", name, err)
		}
		r.UpdatedAt = now
		err = put(ctx, st, r)
		if errors.Is(err, task.ErrConflict) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

func stateError(r *Rollout, op string) error {
	return fmt.Errorf("%w: cannot %s a rollout that is %s", ErrState, op, r.State)
}

// Pause stops dispatching new commands: running ones finish. A paused
// rollout resumes with Resume.
func Pause(ctx context.Context, st Store, name string) (*Rollout, error) {
	return update(ctx, st, name, func(r *Rollout, now time.Time) error {
		switch r.State {
		case StatePaused:
			return errNoChange
		case StateRunning, StateWaiting:
		default:
			return stateError(r, "pause")
		}
		r.State, r.Reason = StatePaused, "paused by an operator"
		r.event(now, EventPaused, "")
		return nil
	})
}

// Resume continues a paused rollout; a wave gate still closed makes it
// wait again.
func Resume(ctx context.Context, st Store, name string) (*Rollout, error) {
	return update(ctx, st, name, func(r *Rollout, now time.Time) error {
		switch r.State {
		case StateRunning:
			return errNoChange
		case StatePaused:
		default:
			return stateError(r, "resume")
		}
		r.State, r.Reason = StateRunning, ""
		r.event(now, EventResumed, "")
		return nil
	})
}

// Cancel stops the rollout for good: nothing more is dispatched, queued
// commands are withdrawn, running ones finish, then the driver records it
// cancelled. No rollback runs. A rollout that dispatches nothing more
// already (completed, aborting or aborted, cancelling or cancelled) is
// returned as it is.
func Cancel(ctx context.Context, st Store, name string) (*Rollout, error) {
	return update(ctx, st, name, func(r *Rollout, now time.Time) error {
		if !r.active() {
			return errNoChange
		}
		r.State, r.Reason = StateCancelling, "cancelled by an operator"
		return nil
	})
}

// Approve opens the gate of the next wave: a rollout waiting at it runs
// on; a running one will not stop at it.
func Approve(ctx context.Context, st Store, name string) (*Rollout, error) {
	return update(ctx, st, name, func(r *Rollout, now time.Time) error {
		next := r.Wave + 1
		if r.State != StateWaiting && r.State != StateRunning && r.State != StatePaused {
			return stateError(r, "approve")
		}
		if next >= len(r.Waves) {
			return fmt.Errorf("%w: no wave is left to approve", ErrState)
		}
		if r.Waves[next].Approved {
			return errNoChange
		}
		r.Waves[next].Approved = true
		if r.State == StateWaiting {
			r.State, r.Reason = StateRunning, ""
		}
		r.event(now, EventApproved, fmt.Sprintf("wave %d", next+1))
		return nil
	})
}

// RetryFailed gives every device whose execution failed (in a wave that
// started) another attempt; a completed rollout runs again. An aborted or
// cancelled one does not.
func RetryFailed(ctx context.Context, st Store, name string) (*Rollout, int, error) {
	n := 0
	r, err := update(ctx, st, name, func(r *Rollout, now time.Time) error {
		n = 0
		switch r.State {
		case StateRunning, StatePaused, StateWaiting, StateCompleted:
		default:
			return stateError(r, "retry")
		}
		for i := range r.Devices {
			if e := &r.Devices[i]; e.Outcome.Failure() {
				e.Outcome, e.EndedAt, e.Error, e.Published = OutcomeQueued, time.Time{}, "", false
				r.Waves[e.Wave].EndedAt = time.Time{}
				n++
			}
		}
		if n == 0 {
			return errNoChange
		}
		if r.State == StateCompleted {
			r.State, r.EndedAt = StateRunning, time.Time{}
		}
		r.event(now, EventRetrying, fmt.Sprintf("%d failed devices", n))
		return nil
	})
	return r, n, err
}

// Over reports whether nothing more happens to the rollout: it is
// completed, cancelled, or aborted with its rollback (if any) ended.
func (r *Rollout) Over() bool {
	return r.State.Final() && (r.Rollback == nil || !r.Rollback.EndedAt.IsZero())
}

// Delete removes a rollout that is over (Over), by compare-and-set on
// its version, and returns it as it was. Any other is refused with
// ErrState: cancel it first, and delete it once it is cancelled (a
// cancel waits for the commands running to end). Its device tasks stay
// in the task store, finished, as any task's history until retention
// deletes them.
func Delete(ctx context.Context, st Store, name string) (*Rollout, error) {
	for {
		r, err := GetHead(ctx, st, name)
		if err != nil {
			return nil, err
		}
		switch {
		case r.active():
			return nil, fmt.Errorf("rollout %s: %w: cannot delete a rollout that is %s: cancel it first, and delete it once it is cancelled",
				name, ErrState, r.State)
		case !r.Over():
			what := string(r.State)
			if r.State == StateAborted {
				what = "rolling back"
			}
			return nil, fmt.Errorf("rollout %s: %w: cannot delete a rollout that is %s: delete it once it is over", name, ErrState, what)
		}
		err = st.DeleteDocument(task.WithInternalWrite(ctx), Namespace, name, r.Version)
		if err == nil {
			err = deleteShards(ctx, st, r)
		}
		switch {
		case errors.Is(err, task.ErrConflict):
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue // written since: look again
		case errors.Is(err, task.ErrNotFound):
			return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
		case err != nil:
			return nil, err
		}
		return r, nil
	}
}
