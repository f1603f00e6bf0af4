package web

// POST /api/v1/tasks: the publish body and its validation, which is the
// CLI's (`leasepool publish`): task.PublishParams.Validate, plus the
// built-in kinds' and device commands' payload checks.

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// maxPublishBody bounds a publish body: the largest payload and room for
// the options around it.
const maxPublishBody = task.MaxPayloadSize + maxBody

// publishBody is a publish as the API takes it, in the task document's
// field names. Durations are "1.5s" strings (or nanoseconds).
type publishBody struct {
	Key                 string          `json:"key"`
	Kind                string          `json:"kind"`
	Payload             json.RawMessage `json:"payload"`
	Priority            int             `json:"priority"`
	RunAt               time.Time       `json:"run_at"`
	Delay               task.Duration   `json:"delay"`
	SpecificWorkerIDs   []string        `json:"specific_worker_ids"`
	ConcurrentWorkerCnt int             `json:"concurrent_worker_cnt"`
	SuccessWorkerCnt    int             `json:"success_worker_cnt"`
	// MaxUnexpectedRetries absent takes the default; 0 means none, as the
	// stored document spells it.
	MaxUnexpectedRetries *int          `json:"max_unexpected_retries"`
	PingInterval         task.Duration `json:"ping_interval"`
	WorkerTimeout        task.Duration `json:"worker_timeout"`
	LockKeys             []string      `json:"lock_keys"`
	Group                string        `json:"group"`
	Rerun                bool          `json:"rerun"`
	// Debounce absent is off; given, it must be positive.
	Debounce *task.Duration `json:"debounce"`
}

// params validates b completely, naming the field at fault, before the
// store is touched.
func (b publishBody) params(now time.Time) (task.PublishParams, error) {
	p := task.PublishParams{Key: b.Key, Kind: b.Kind, Payload: b.Payload, Rerun: b.Rerun, Options: task.Options{
		Priority: b.Priority, RunAt: b.RunAt, SpecificWorkerIDs: b.SpecificWorkerIDs,
		ConcurrentWorkerCnt: b.ConcurrentWorkerCnt, SuccessWorkerCnt: b.SuccessWorkerCnt,
		PingInterval: time.Duration(b.PingInterval), WorkerTimeout: time.Duration(b.WorkerTimeout), LockKeys: b.LockKeys,
		Group: b.Group,
	}}
	switch {
	case b.Delay < 0:
		return p, badInput("delay", "must not be negative")
	case b.Delay > 0 && !b.RunAt.IsZero():
		return p, badInput("delay", "give run_at or delay, not both")
	case b.Delay > 0 && now.Add(time.Duration(b.Delay)).After(task.MaxTime):
		return p, badInput("delay", "ends after %s", task.MaxTime.Format(time.DateOnly))
	case b.Delay > 0:
		p.RunAt = now.Add(time.Duration(b.Delay))
	}
	if d := b.Debounce; d != nil {
		if err := task.ValidateDebounce("debounce", time.Duration(*d)); err != nil {
			return p, err
		}
		p.Debounce = time.Duration(*d)
	}
	if r := b.MaxUnexpectedRetries; r != nil {
		switch {
		case *r < 0:
			return p, badInput("max_unexpected_retries", "must not be negative")
		case *r == 0:
			p.MaxUnexpectedRetries = task.NoRetries
		default:
			p.MaxUnexpectedRetries = *r
		}
	}
	if err := p.Validate(); err != nil {
		return p, err
	}
	switch {
	case p.Kind == mqttdev.Kind:
		// A device command: its device's lock key serialises it.
		cmd, err := mqttdev.DecodePayload(p.Payload)
		if err != nil {
			return p, inPayload(err)
		}
		dp, err := mqttdev.PublishParams(p.Key, cmd, p.Options)
		dp.Debounce = p.Debounce
		return dp, err
	case slices.Contains(builtin.Kinds, p.Kind):
		if err := builtin.Validate(p.Kind, p.Payload); err != nil {
			return p, err
		}
	}
	// Other kinds are a library user's handlers: task validation only.
	return p, nil
}

// inPayload makes a payload check's error name the payload field.
func inPayload(err error) error {
	if r := reason(err); !strings.HasPrefix(r, "payload: ") {
		return badInput("payload", "device: %s", r)
	}
	return err
}

// publishResponse answers a publish: what it did and the task as stored.
type publishResponse struct {
	Result task.PublishResult `json:"result"`
	Task   *task.Task         `json:"task"`
	// Warnings are about a publish that was done but may not be what the
	// caller meant: a kind no live worker runs (the task waits until one
	// does). Absent when there are none.
	Warnings []string `json:"warnings,omitempty"`
}

// publish answers 201 for a new task, 200 when it existed (or reran), with
// a warning when no live worker runs the task's kind; ?strict=true refuses
// such a kind instead (400 naming kind, nothing written).
func (a *api) publish(w http.ResponseWriter, r *http.Request) {
	strict, err := strictParam(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	var body publishBody
	if err := decodeLimit(w, r, &body, maxPublishBody); err != nil {
		a.fail(w, r, err)
		return
	}
	p, err := body.params(a.store.Now())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	warnings, err := a.kindWarnings(r, strict, kindRef{"kind", p.Kind})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ctx, err := traced(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	t, res, err := task.Publish(ctx, a.store, p)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	code := http.StatusOK
	if res == task.Inserted {
		code = http.StatusCreated
	}
	a.log.Info("web: published", "key", t.Key, "result", string(res))
	writeJSON(w, code, publishResponse{Result: res, Task: t, Warnings: warnings})
}

// strictParam reads ?strict: refuse a kind no live worker runs rather
// than warn of it.
func strictParam(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("strict")
	if v == "" {
		return false, nil
	}
	strict, err := strconv.ParseBool(v)
	if err != nil {
		return false, badInput("strict", "%q is not true or false", v)
	}
	return strict, nil
}

// kindRef is a kind a publish would store a task of, and the body's field
// that names it.
type kindRef struct{ field, kind string }

// kindWarnings returns a warning for each kind of refs (each once) that no
// live worker runs; strict refuses the first such kind instead, naming its
// field.
func (a *api) kindWarnings(r *http.Request, strict bool, refs ...kindRef) ([]string, error) {
	kinds := make([]string, len(refs))
	for i, ref := range refs {
		kinds[i] = ref.kind
	}
	missing, err := task.KindsWithoutWorker(r.Context(), a.store, a.store.Now(), kinds...)
	if err != nil {
		return nil, err
	}
	if strict && len(missing) > 0 {
		i := slices.IndexFunc(refs, func(ref kindRef) bool { return ref.kind == missing[0].Kind })
		return nil, missing[0].Refusal(refs[i].field)
	}
	var warnings []string
	for _, n := range missing {
		warnings = append(warnings, n.Warning())
	}
	return warnings, nil
}
