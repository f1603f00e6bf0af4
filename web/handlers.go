package web

// The handlers: pauses and rate limits (package control) and schedule
// pause/resume (package schedule). Each reads and validates all its input
// before it touches the store, so bad input writes nothing.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/jsoncheck"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// targetBody is a target as the API takes it, in a body or a query.
type targetBody struct {
	Scope string `json:"scope"`
	Name  string `json:"name"`
}

// target validates t, naming the field at fault.
func (t targetBody) target() (control.Target, error) {
	var ct control.Target
	switch control.Scope(t.Scope) {
	case control.ScopeAll:
		if t.Name != "" {
			return ct, badInput("name", "scope all takes no name, got %q", t.Name)
		}
		return control.All(), nil
	case control.ScopeKind:
		ct = control.Kind(t.Name)
	case control.ScopeLock:
		ct = control.Lock(t.Name)
	case control.ScopeGroup:
		ct = control.Group(t.Name)
	default:
		return ct, badInput("scope", "%q is not one of all, kind, lock, group", t.Scope)
	}
	if err := ct.Validate(); err != nil {
		return ct, badInput("name", "%s", reason(err))
	}
	return ct, nil
}

// queryTarget reads ?scope=..&name=.. (DELETE takes no body).
func queryTarget(r *http.Request) (control.Target, error) {
	q := r.URL.Query()
	return targetBody{Scope: q.Get("scope"), Name: q.Get("name")}.target()
}

// decode reads the one JSON object of r's body into v; unknown fields and
// trailing data are bad input.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeLimit(w, r, v, maxBody)
}

// decodeUnique is decode refusing an object that holds a key twice
// (jsoncheck.Keys): a labels body means one value per key.
func decodeUnique(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeChecked(w, r, v, maxBody, jsoncheck.Keys)
}

// decodeLimit is decode of a body of at most limit bytes.
func decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	return decodeChecked(w, r, v, limit, nil)
}

// decodeChecked is decodeLimit with check (if any) run on the body after
// jsoncheck.Body.
func decodeChecked(w http.ResponseWriter, r *http.Request, v any, limit int64, check func([]byte) error) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if me := (*http.MaxBytesError)(nil); errors.As(err, &me) {
		return fmt.Errorf("%w: body: larger than %d bytes", errTooLarge, me.Limit)
	}
	if err != nil {
		return badInput("body", "want one JSON object: %v", err)
	}
	return decodeBytes(b, v, check)
}

// decodeBytes decodes the one JSON object of b into v as decodeChecked
// does, with check (if any) run on b after jsoncheck.Body.
func decodeBytes(b []byte, v any, check func([]byte) error) error {
	// Invalid UTF-8 (which the decoder rewrites to U+FFFD) and nesting
	// past task.MaxJSONDepth are refused first, naming the field.
	if err := jsoncheck.Body(b); err != nil {
		return err
	}
	if check != nil {
		if err := check(b); err != nil {
			return err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return badInput(te.Field, "want a JSON %s, got %s", te.Type, te.Value)
		}
		return badInput("body", "want one JSON object: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badInput("body", "want one JSON object, got more after it")
	}
	return nil
}

// changedBody answers a write that may find nothing to do.
type changedBody struct {
	Changed bool `json:"changed"`
}

func (a *api) listPauses(w http.ResponseWriter, r *http.Request) {
	list(a, w, r, control.Pauses)
}

func (a *api) listLimits(w http.ResponseWriter, r *http.Request) {
	list(a, w, r, control.Limits)
}

func (a *api) listSchedules(w http.ResponseWriter, r *http.Request) {
	list(a, w, r, schedule.List)
}

// list answers what read returns as a JSON array ([] when none).
func list[T any](a *api, w http.ResponseWriter, r *http.Request, read func(context.Context, task.Store) ([]T, error)) {
	items, err := read(r.Context(), a.store)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if items == nil {
		items = []T{}
	}
	writeJSON(w, http.StatusOK, items)
}

// pause answers 201 when it paused the target, 200 when already paused.
func (a *api) pause(w http.ResponseWriter, r *http.Request) {
	var body targetBody
	if err := decode(w, r, &body); err != nil {
		a.fail(w, r, err)
		return
	}
	t, err := body.target()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	changed, err := control.Pause(r.Context(), a.store, t)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	code := http.StatusOK
	if changed {
		code = http.StatusCreated
		a.log.Info("web: paused", "target", t.String())
	}
	writeJSON(w, code, changedBody{Changed: changed})
}

func (a *api) resume(w http.ResponseWriter, r *http.Request) {
	a.removeTarget(w, r, "resumed", control.Resume)
}

func (a *api) removeLimit(w http.ResponseWriter, r *http.Request) {
	a.removeTarget(w, r, "removed limit", control.RemoveLimit)
}

// removeTarget runs a DELETE of the query's target: lift a pause or
// remove a limit.
func (a *api) removeTarget(w http.ResponseWriter, r *http.Request, verb string,
	fn func(ctx context.Context, st task.Store, t control.Target) (bool, error)) {
	t, err := queryTarget(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	changed, err := fn(r.Context(), a.store, t)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if changed {
		a.log.Info("web: "+verb, "target", t.String())
	}
	writeJSON(w, http.StatusOK, changedBody{Changed: changed})
}

// limitBody is PUT /api/v1/limits: a target and the parts to set: a rate
// as the CLI's --rate reads it ("2/1s"), a group's weight, a
// concurrency. Parts left out stay as stored; at least one is given.
type limitBody struct {
	targetBody
	Rate        string `json:"rate"`
	Weight      *int   `json:"weight"`
	Concurrency *int   `json:"concurrency"`
}

// setLimit answers the limit stored.
func (a *api) setLimit(w http.ResponseWriter, r *http.Request) {
	var body limitBody
	if err := decode(w, r, &body); err != nil {
		a.fail(w, r, err)
		return
	}
	l, err := body.limit()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if err := control.SetLimit(r.Context(), a.store, l); err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: set limit", "target", l.Target.String(), "rate", l.String())
	writeJSON(w, http.StatusOK, l)
}

// limit validates the body, naming the field at fault.
func (b limitBody) limit() (control.Limit, error) {
	t, err := b.target()
	if err != nil {
		return control.Limit{}, err
	}
	if t.Scope == control.ScopeAll {
		return control.Limit{}, badInput("scope", "a limit applies to a kind, a lock key or a group, not all")
	}
	l := control.Limit{Target: t}
	if b.Weight != nil {
		if l.Weight = *b.Weight; l.Weight < 1 || l.Weight > control.MaxWeight {
			return l, badInput("weight", "must be 1 to %d, got %d", control.MaxWeight, l.Weight)
		}
		if t.Scope != control.ScopeGroup {
			return l, badInput("weight", "applies to scope group only")
		}
	}
	if b.Concurrency != nil {
		if l.Concurrency = *b.Concurrency; l.Concurrency < 1 || l.Concurrency > control.MaxConcurrency {
			return l, badInput("concurrency", "must be 1 to %d, got %d", control.MaxConcurrency, l.Concurrency)
		}
	}
	if b.Rate == "" && (b.Weight != nil || b.Concurrency != nil) {
		return l, nil
	}
	n, per, err := control.ParseRate(b.Rate)
	if err != nil {
		return control.Limit{}, badInput("rate", "%s", reason(err))
	}
	l.N, l.Per = n, per
	if err := l.Validate(); err != nil {
		return l, badInput("rate", "%s", reason(err))
	}
	return l, nil
}

func (a *api) pauseSchedule(w http.ResponseWriter, r *http.Request) {
	a.modifySchedule(w, r, "paused schedule", schedule.Pause)
}

func (a *api) resumeSchedule(w http.ResponseWriter, r *http.Request) {
	a.modifySchedule(w, r, "resumed schedule", schedule.Resume)
}

// modifySchedule runs fn on the schedule {name} and answers it as stored.
func (a *api) modifySchedule(w http.ResponseWriter, r *http.Request, verb string,
	fn func(ctx context.Context, st task.Store, name string) (*schedule.Schedule, error)) {
	name := r.PathValue("name")
	sch, err := fn(r.Context(), a.store, name)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: "+verb, "name", name)
	writeJSON(w, http.StatusOK, sch)
}
