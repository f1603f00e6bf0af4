package web

// The flows API: publish a flow from its JSON (as `leasepool flow publish`
// reads it), one flow, the list, cancel (with rollback if asked), retry,
// and a signal to a signal step.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// maxFlowsListed bounds GET /api/v1/flows.
const maxFlowsListed = 1000

type flowResponse struct {
	Result task.PublishResult `json:"result"`
	Flow   *flow.Flow         `json:"flow"`
	// Warnings are as a task publish's: a step's (or rollback's) kind no
	// live worker runs. Absent when there are none.
	Warnings []string `json:"warnings,omitempty"`
}

// publishFlow reads a flow spec strictly (an unknown field is a 400 naming
// it), checks device steps as device commands (adding their lock keys) and
// publishes it, idempotently by key, with a warning for each kind of its
// task steps and rollbacks that no live worker runs; ?strict=true refuses
// such a kind instead (400 naming the step's field, nothing written).
func (a *api) publishFlow(w http.ResponseWriter, r *http.Request) {
	strict, err := strictParam(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxPublishBody)
	spec, err := flow.ParseSpec(r.Body)
	if err == nil {
		err = spec.Validate()
	}
	if err == nil {
		err = mqttdev.PrepareFlow(&spec)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	warnings, err := a.kindWarnings(r, strict, flowKinds(spec)...)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ctx, err := traced(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	f, res, err := flow.Publish(ctx, a.store, spec)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	code := http.StatusOK
	if res == task.Inserted {
		code = http.StatusCreated
	}
	a.log.Info("web: flow published", "key", f.Key, "result", string(res))
	writeJSON(w, code, flowResponse{Result: res, Flow: f, Warnings: warnings})
}

// flowKinds are the kinds of the tasks a flow's steps publish: each task
// step's and its rollback's, in step order, as `leasepool flow publish`
// checks them. A signal or sleep step's timer is a kind every worker runs.
func flowKinds(spec flow.Spec) []kindRef {
	var refs []kindRef
	for i, st := range spec.Steps {
		if st.StepType() != flow.TypeTask {
			continue
		}
		field := fmt.Sprintf("steps[%d]", i)
		refs = append(refs, kindRef{field + ".kind", st.Kind})
		if st.Rollback != nil {
			refs = append(refs, kindRef{field + ".rollback.kind", st.Rollback.Kind})
		}
	}
	return refs
}

func (a *api) getFlow(w http.ResponseWriter, r *http.Request) {
	f, err := flow.Get(r.Context(), a.store, r.PathValue("key"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, f)
}

// listFlows answers the flows in publish order: ?active=true keeps those
// still moving; ?limit (default and most 1000).
func (a *api) listFlows(w http.ResponseWriter, r *http.Request) {
	q := flow.ListQuery{Limit: maxFlowsListed}
	if v := r.URL.Query().Get("active"); v != "" {
		active, err := strconv.ParseBool(v)
		if err != nil {
			a.fail(w, r, badInput("active", "%q is not true or false", v))
			return
		}
		q.Active = active
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxFlowsListed {
			a.fail(w, r, badInput("limit", "%q is not a number from 1 to %d", v, maxFlowsListed))
			return
		}
		q.Limit = n
	}
	fs, err := flow.List(r.Context(), a.store, q)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if fs == nil {
		fs = []*flow.Flow{}
	}
	writeJSON(w, http.StatusOK, struct {
		Flows []*flow.Flow `json:"flows"`
	}{fs})
}

// cancelFlow stops the flow's running step; ?rollback=true then undoes the
// started steps in reverse.
func (a *api) cancelFlow(w http.ResponseWriter, r *http.Request) {
	rollback := false
	if v := r.URL.Query().Get("rollback"); v != "" {
		var err error
		if rollback, err = strconv.ParseBool(v); err != nil {
			a.fail(w, r, badInput("rollback", "%q is not true or false", v))
			return
		}
	}
	a.flowAction(w, r, "cancelled", func(key string) (*flow.Flow, error) {
		return flow.Cancel(r.Context(), a.store, key, rollback)
	})
}

func (a *api) retryFlow(w http.ResponseWriter, r *http.Request) {
	a.flowAction(w, r, "retried", func(key string) (*flow.Flow, error) {
		return flow.Retry(r.Context(), a.store, key)
	})
}

func (a *api) flowAction(w http.ResponseWriter, r *http.Request, verb string, fn func(key string) (*flow.Flow, error)) {
	key := r.PathValue("key")
	f, err := fn(key)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: flow "+verb, "key", key)
	writeJSON(w, http.StatusOK, f)
}

// signalFlow sends the signal step {step} of flow {key} its signal; the
// body, if any, is the payload (one JSON value), the step's result. 404:
// no such flow or step; 409: the step has its signal already or the flow
// is not pending or running; 400: not a signal step, or a bad payload.
func (a *api) signalFlow(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxPublishBody)
	payload, err := io.ReadAll(r.Body)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	key, step := r.PathValue("key"), r.PathValue("step")
	f, err := flow.Signal(r.Context(), a.store, key, step, bytes.TrimSpace(payload))
	switch {
	case errors.Is(err, flow.ErrStepNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, flow.ErrAlreadySignalled):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, flow.ErrNotSignalStep):
		writeError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		a.fail(w, r, err)
	default:
		a.log.Info("web: flow signalled", "key", key, "step", step)
		writeJSON(w, http.StatusOK, f)
	}
}
