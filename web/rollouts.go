package web

// The rollouts API (package rollout): list, create, one rollout, the
// operators' pause, resume, cancel, approve and retry-failed, and delete;
// and the device labels of the inventory (PUT replaces, PATCH edits).

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
)

// rolloutBody is a create request: the CLI's flags as fields, with the
// same syntax for waves, rate, abort_when and retry_on.
type rolloutBody struct {
	Name            string          `json:"name"`
	Command         string          `json:"command"`
	Args            json.RawMessage `json:"args"`
	Select          string          `json:"select"`
	Devices         []string        `json:"devices"`
	Waves           string          `json:"waves"`
	ApproveWaves    bool            `json:"approve_waves"`
	GateFailures    float64         `json:"gate_failures"`
	Rate            string          `json:"rate"`
	AbortWhen       string          `json:"abort_when"`
	Timeout         string          `json:"timeout"`
	OfflineLimit    string          `json:"offline_limit"`
	Retries         int             `json:"retries"`
	RetryOn         string          `json:"retry_on"`
	RollbackCommand string          `json:"rollback_command"`
	RollbackArgs    json.RawMessage `json:"rollback_args"`
	Priority        int             `json:"priority"`
}

func (b rolloutBody) spec() (rollout.Spec, error) {
	s := rollout.Spec{Command: b.Command, Args: b.Args, Select: b.Select, Devices: b.Devices, ApproveWaves: b.ApproveWaves,
		GateFailures: b.GateFailures, Retries: b.Retries, RollbackCommand: b.RollbackCommand, RollbackArgs: b.RollbackArgs, Priority: b.Priority}
	if string(s.Args) == "null" {
		s.Args = nil
	}
	if string(s.RollbackArgs) == "null" {
		s.RollbackArgs = nil
	}
	var err error
	if b.Waves != "" {
		if s.Waves, err = rollout.ParseWaves(b.Waves); err != nil {
			return s, err
		}
	}
	if b.Rate != "" {
		if s.Rate, err = rollout.ParseRate(b.Rate); err != nil {
			return s, err
		}
	}
	if b.AbortWhen != "" {
		if s.AbortWhen, err = rollout.ParseAbortRules(b.AbortWhen); err != nil {
			return s, err
		}
	}
	if b.RetryOn != "" {
		if s.RetryOn, err = rollout.ParseRetryOn(b.RetryOn); err != nil {
			return s, err
		}
	}
	for _, d := range []struct {
		field, v string
		dst      *task.Duration
	}{{"timeout", b.Timeout, &s.Timeout}, {"offline_limit", b.OfflineLimit, &s.OfflineLimit}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v <= 0 {
			return s, badInput(d.field, "%q is not a positive duration such as 30s", d.v)
		}
		*d.dst = task.Duration(v)
	}
	return s, s.Validate()
}

// rolloutFail answers the rollout errors (404 unknown, 409 a name taken
// or a state that refuses), then as fail does.
func (a *api) rolloutFail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, rollout.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, rollout.ErrExists), errors.Is(err, rollout.ErrState):
		writeError(w, http.StatusConflict, err.Error())
	default:
		a.fail(w, r, err)
	}
}

func (a *api) listRollouts(w http.ResponseWriter, r *http.Request) {
	list, err := rollout.List(r.Context(), a.store)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := make([]rollout.Progress, 0, len(list))
	for _, ro := range list {
		out = append(out, ro.Progress())
	}
	writeJSON(w, http.StatusOK, struct {
		Rollouts []rollout.Progress `json:"rollouts"`
	}{out})
}

// createRollout creates a rollout; ?dry_run=true answers its plan (the
// devices of each wave) instead, writing nothing.
func (a *api) createRollout(w http.ResponseWriter, r *http.Request) {
	dryRun := false
	if v := r.URL.Query().Get("dry_run"); v != "" {
		var err error
		if dryRun, err = strconv.ParseBool(v); err != nil {
			a.fail(w, r, badInput("dry_run", "%q is not true or false", v))
			return
		}
	}
	var b rolloutBody
	if err := decodeLimit(w, r, &b, maxPublishBody); err != nil {
		a.fail(w, r, err)
		return
	}
	if err := rollout.ValidateName(b.Name); err != nil {
		a.fail(w, r, err)
		return
	}
	spec, err := b.spec()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if dryRun {
		ro, err := rollout.DryRun(r.Context(), a.store, b.Name, spec)
		if err != nil {
			a.rolloutFail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, ro.Plan())
		return
	}
	ctx, err := traced(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ro, err := rollout.Create(ctx, a.store, b.Name, spec)
	if err != nil {
		a.rolloutFail(w, r, err)
		return
	}
	a.log.Info("web: rollout created", "name", ro.Name, "devices", ro.DeviceCount)
	writeJSON(w, http.StatusCreated, ro.Progress())
}

// getRollout answers the progress, read from the rollout's aggregates;
// ?devices=true the whole rollout with every device's execution (every
// shard read: GET .../devices pages them instead).
func (a *api) getRollout(w http.ResponseWriter, r *http.Request) {
	devices := false
	if v := r.URL.Query().Get("devices"); v != "" {
		var err error
		if devices, err = strconv.ParseBool(v); err != nil {
			a.fail(w, r, badInput("devices", "%q is not true or false", v))
			return
		}
	}
	get := rollout.GetHead
	if devices {
		get = rollout.Get
	}
	ro, err := get(r.Context(), a.store, r.PathValue("name"))
	if err != nil {
		a.rolloutFail(w, r, err)
		return
	}
	if devices {
		writeJSON(w, http.StatusOK, struct {
			*rollout.Rollout
			Devices []rollout.Exec `json:"devices"`
		}{ro, ro.Devices})
		return
	}
	writeJSON(w, http.StatusOK, ro.Progress())
}

// rolloutDevices serves GET /api/v1/rollouts/{name}/devices: one page of
// the executions (?offset, ?limit up to maxDevicePage, ?outcome), reading
// only the shards that hold it.
func (a *api) rolloutDevices(w http.ResponseWriter, r *http.Request) {
	offset, limit, outcome, err := devicePageQuery(r, 100)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ro, err := rollout.GetHead(r.Context(), a.store, r.PathValue("name"))
	if err != nil {
		a.rolloutFail(w, r, err)
		return
	}
	page, err := rollout.Devices(r.Context(), a.store, ro, offset, limit, outcome)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// maxDevicePage bounds a page of a rollout's executions.
const maxDevicePage = 1000

// devicePageQuery reads ?offset, ?limit (def when absent) and ?outcome.
func devicePageQuery(r *http.Request, def int) (offset, limit int, outcome rollout.Outcome, err error) {
	q := r.URL.Query()
	limit = def
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			return 0, 0, "", badInput("offset", "%q is not a count from 0", v)
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxDevicePage {
			return 0, 0, "", badInput("limit", "%q is not a count from 1 to %d", v, maxDevicePage)
		}
	}
	if v := q.Get("outcome"); v != "" {
		if outcome, err = rollout.ParseOutcome("outcome", v); err != nil {
			return 0, 0, "", err
		}
	}
	return offset, limit, outcome, nil
}

var knownOutcomes = rollout.Outcomes

// deleteRollout serves DELETE /api/v1/rollouts/{name}: a rollout that is
// over is deleted (its device tasks stay); any other is 409.
func (a *api) deleteRollout(w http.ResponseWriter, r *http.Request) {
	ro, err := rollout.Delete(r.Context(), a.store, r.PathValue("name"))
	if err != nil {
		a.rolloutFail(w, r, err)
		return
	}
	a.log.Info("web: rollout deleted", "name", ro.Name, "state", string(ro.State))
	writeJSON(w, http.StatusOK, struct {
		Name    string        `json:"name"`
		Deleted bool          `json:"deleted"`
		State   rollout.State `json:"state"`
	}{ro.Name, true, ro.State})
}

// rolloutAction serves POST /api/v1/rollouts/{name}/{op}.
func (a *api) rolloutAction(op string, fn func(r *http.Request, name string) (*rollout.Rollout, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		ro, err := fn(r, name)
		if err != nil {
			a.rolloutFail(w, r, err)
			return
		}
		a.log.Info("web: rollout "+op, "name", name)
		writeJSON(w, http.StatusOK, ro.Progress())
	}
}

func (a *api) pauseRollout(r *http.Request, name string) (*rollout.Rollout, error) {
	return rollout.Pause(r.Context(), a.store, name)
}

func (a *api) resumeRollout(r *http.Request, name string) (*rollout.Rollout, error) {
	return rollout.Resume(r.Context(), a.store, name)
}

func (a *api) cancelRollout(r *http.Request, name string) (*rollout.Rollout, error) {
	return rollout.Cancel(r.Context(), a.store, name)
}

func (a *api) approveRollout(r *http.Request, name string) (*rollout.Rollout, error) {
	return rollout.Approve(r.Context(), a.store, name)
}

func (a *api) retryFailedRollout(r *http.Request, name string) (*rollout.Rollout, error) {
	ro, _, err := rollout.RetryFailed(r.Context(), a.store, name)
	return ro, err
}

// putDeviceLabels replaces the device's operator labels: {"labels":{k:v}}.
func (a *api) putDeviceLabels(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Labels mqttdev.Labels `json:"labels"`
	}
	if err := decodeUnique(w, r, &b); err != nil {
		a.fail(w, r, err)
		return
	}
	inv, err := mqttdev.ReplaceLabels(r.Context(), a.store, r.PathValue("id"), b.Labels)
	a.labelsDone(w, r, inv, err)
}

// patchDeviceLabels edits them: {"set":{k:v},"remove":[k]}.
func (a *api) patchDeviceLabels(w http.ResponseWriter, r *http.Request) {
	var ch mqttdev.LabelChange
	if err := decodeUnique(w, r, &ch); err != nil {
		a.fail(w, r, err)
		return
	}
	inv, err := mqttdev.SetLabels(r.Context(), a.store, r.PathValue("id"), ch)
	a.labelsDone(w, r, inv, err)
}

func (a *api) labelsDone(w http.ResponseWriter, r *http.Request, inv mqttdev.Inventory, err error) {
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: device labels set", "device", inv.ID, "labels", inv.Labels.String())
	writeJSON(w, http.StatusOK, inv)
}
