package web

// The remote worker protocol (docs/http-api.md#remote-workers): register
// and heartbeat, claim with a long poll, renew, finish. The handlers only
// translate: the claim rules, renewals and outcome writes are
// consumer.RemoteWorkers', the same as a Go worker's.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

func (a *api) remoteRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/v1/workers/{id}", a.write(a.remoteHeartbeat))
	mux.HandleFunc("DELETE /api/v1/workers/{id}", a.write(a.remoteUnregister))
	mux.HandleFunc("POST /api/v1/workers/{id}/claim", a.write(a.remoteClaim))
	mux.HandleFunc("POST /api/v1/workers/{id}/jobs/{key}/renew", a.write(a.remoteRenew))
	mux.HandleFunc("POST /api/v1/workers/{id}/jobs/{key}/finish", a.write(a.remoteFinish))
	mux.HandleFunc("POST /api/v1/workers/{id}/finish", a.write(a.remoteFinishMany))
}

// heldAttempt names an attempt in a heartbeat's held list and its lost one.
type heldAttempt struct {
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	Reason  string `json:"reason,omitempty"`
}

type heartbeatBody struct {
	Instance    string        `json:"instance"`
	Kinds       []string      `json:"kinds"`
	Concurrency int           `json:"concurrency"`
	Running     int           `json:"running"`
	Host        string        `json:"host"`
	PID         int           `json:"pid"`
	Held        []heldAttempt `json:"held"`
}

func (a *api) remoteHeartbeat(w http.ResponseWriter, r *http.Request) {
	var b heartbeatBody
	if err := decodeLimit(w, r, &b, 1<<20); err != nil {
		a.fail(w, r, err)
		return
	}
	if len(b.Kinds) == 0 {
		a.fail(w, r, badInput("kinds", "must name at least one kind"))
		return
	}
	if err := a.allowKinds(r, b.Kinds); err != nil {
		a.remoteFail(w, r, err)
		return
	}
	rw := RemoteWorker{ID: r.PathValue("id"), Instance: b.Instance, Kinds: b.Kinds,
		Concurrency: b.Concurrency, Running: b.Running, Host: b.Host, PID: b.PID}
	for _, h := range b.Held {
		rw.Held = append(rw.Held, consumer.RemoteAttempt{Key: h.Key, Attempt: h.Attempt})
	}
	info, lost, err := a.remote.Heartbeat(r.Context(), rw)
	if err != nil {
		a.remoteFail(w, r, err)
		return
	}
	out := []heldAttempt{}
	for _, l := range lost {
		out = append(out, heldAttempt{Key: l.Key, Attempt: l.Attempt, Reason: lossCode(l.Cause)})
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"worker":       info,
		"heartbeat_ms": a.remote.HeartbeatInterval().Milliseconds(),
		"ttl_ms":       a.remote.HeartbeatTimeout().Milliseconds(),
		"lost":         out,
	})
}

// RemoteWorker is consumer.RemoteWorker: the web package's handlers
// build it from a heartbeat body.
type RemoteWorker = consumer.RemoteWorker

func (a *api) remoteUnregister(w http.ResponseWriter, r *http.Request) {
	instance := r.URL.Query().Get("instance")
	if instance == "" {
		a.fail(w, r, badInput("instance", "must be given as a query parameter"))
		return
	}
	if err := a.remote.Unregister(r.Context(), r.PathValue("id"), instance); err != nil {
		a.remoteFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"unregistered": true})
}

type claimBody struct {
	Instance string   `json:"instance"`
	Kinds    []string `json:"kinds"`
	Max      *int     `json:"max"`
	WaitMS   *int64   `json:"wait_ms"`
}

// remoteJob is a claimed attempt as the protocol sends it.
type remoteJob struct {
	Key        string          `json:"key"`
	Kind       string          `json:"kind"`
	Attempt    int             `json:"attempt"`
	Payload    json.RawMessage `json:"payload"`
	Priority   int             `json:"priority"`
	LeaseUntil time.Time       `json:"lease_until"`
	LeaseMS    int64           `json:"lease_ms"`
	RenewMS    int64           `json:"renew_ms"`
	CreatedAt  time.Time       `json:"created_at"`
	// Traceparent and Tracestate are the task's trace context, for the
	// remote worker's span of the attempt to continue.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	// FlowStep is set on a flow step's task: its flow, step and shared
	// parameters; Payload is then the step's own payload, out of the
	// envelope the flow wraps it in.
	FlowStep *flow.StepView `json:"flow_step,omitempty"`
}

// defaultClaimWait is a claim's wait when the body names none.
const defaultClaimWait = 20 * time.Second

func (a *api) remoteClaim(w http.ResponseWriter, r *http.Request) {
	var b claimBody
	if err := decode(w, r, &b); err != nil {
		a.fail(w, r, err)
		return
	}
	if b.Instance == "" {
		a.fail(w, r, badInput("instance", "must not be empty"))
		return
	}
	jobs, err := a.claimFor(w, r, b.Instance, b)
	if err != nil {
		a.remoteFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": jobs})
}

// claimFor claims what b asks for, for the instance of the worker r names.
func (a *api) claimFor(w http.ResponseWriter, r *http.Request, instance string, b claimBody) ([]remoteJob, error) {
	c := consumer.RemoteClaim{ID: r.PathValue("id"), Instance: instance, Kinds: b.Kinds, Max: 1, Wait: defaultClaimWait}
	if b.Max != nil {
		c.Max = *b.Max
	}
	if b.WaitMS != nil {
		c.Wait = time.Duration(*b.WaitMS) * time.Millisecond
	}
	if allowed, ok := workerKinds(r); ok && len(allowed) > 0 {
		if len(c.Kinds) == 0 {
			c.Kinds = allowed
		} else if err := a.allowKinds(r, c.Kinds); err != nil {
			return nil, err
		}
	}
	// The answer may come a whole wait later than the server's write
	// bound allows for.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(c.Wait + a.writeTimeout))
	jobs, err := a.remote.Claim(r.Context(), c)
	if err != nil {
		return nil, err
	}
	out := make([]remoteJob, 0, len(jobs))
	for _, j := range jobs {
		t := j.Task
		p := t.Payload
		var step *flow.StepView
		if sp, sv, ok := flow.UnwrapStep(t); ok {
			p, step = sp, &sv
		}
		if len(p) == 0 {
			p = json.RawMessage("null")
		}
		out = append(out, remoteJob{
			Key: t.Key, Kind: t.Kind, Attempt: j.Holder.Attempt, Payload: p, Priority: t.Priority,
			LeaseUntil: j.LeaseUntil().UTC(), LeaseMS: time.Duration(t.WorkerTimeout).Milliseconds(),
			RenewMS: time.Duration(t.PingInterval).Milliseconds(), CreatedAt: t.CreatedAt.UTC(),
			Traceparent: t.Trace.Traceparent, Tracestate: t.Trace.Tracestate, FlowStep: step,
		})
	}
	return out, nil
}

type renewBody struct {
	Instance string   `json:"instance"`
	Attempt  int      `json:"attempt"`
	Log      []string `json:"log"`
}

func (a *api) attemptOf(r *http.Request, instance string, attempt int) (consumer.RemoteAttempt, error) {
	if instance == "" {
		return consumer.RemoteAttempt{}, badInput("instance", "must not be empty")
	}
	if attempt < 1 {
		return consumer.RemoteAttempt{}, badInput("attempt", "must be at least 1")
	}
	ra := consumer.RemoteAttempt{Key: r.PathValue("key"), WorkerID: r.PathValue("id"), Instance: instance, Attempt: attempt}
	ra.Kinds, _ = workerKinds(r)
	return ra, nil
}

func (a *api) remoteRenew(w http.ResponseWriter, r *http.Request) {
	var b renewBody
	if err := decode(w, r, &b); err != nil {
		a.fail(w, r, err)
		return
	}
	ra, err := a.attemptOf(r, b.Instance, b.Attempt)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	doc, err := a.remote.Renew(r.Context(), ra, b.Log)
	if err != nil {
		a.remoteFail(w, r, err)
		return
	}
	until := time.Time{}
	if i := doc.Entry(task.Holder{TaskKey: ra.Key, WorkerID: ra.WorkerID, Instance: ra.Instance, Attempt: ra.Attempt}); i >= 0 {
		until = doc.Attempts[i].LeaseUntil.UTC()
	}
	writeJSON(w, http.StatusOK, map[string]any{"lease_until": until, "lease_ms": time.Duration(doc.WorkerTimeout).Milliseconds()})
}

type finishBody struct {
	Instance string          `json:"instance"`
	Attempt  int             `json:"attempt"`
	Outcome  string          `json:"outcome"`
	Result   json.RawMessage `json:"result"`
	Error    string          `json:"error"`
	SnoozeMS int64           `json:"snooze_ms"`
	Log      []string        `json:"log"`
}

func (a *api) remoteFinish(w http.ResponseWriter, r *http.Request) {
	var b finishBody
	if err := decode(w, r, &b); err != nil {
		a.fail(w, r, err)
		return
	}
	ra, err := a.attemptOf(r, b.Instance, b.Attempt)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	doc, outcome, err := a.remote.Finish(r.Context(), ra, b.outcome())
	if err != nil {
		a.remoteFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"state": string(doc.State), "outcome": string(outcome)})
}

func (b finishBody) outcome() consumer.RemoteOutcome {
	return consumer.RemoteOutcome{Outcome: consumer.Outcome(b.Outcome), Result: b.Result, Error: b.Error,
		Snooze: time.Duration(b.SnoozeMS) * time.Millisecond, Log: b.Log}
}

// finishManyBody finishes several attempts of one worker instance and
// then, with Claim, claims more in the same round trip.
type finishManyBody struct {
	Instance string         `json:"instance"`
	Outcomes []finishedItem `json:"outcomes"`
	Claim    *claimBody     `json:"claim"`
}

type finishedItem struct {
	Key string `json:"key"`
	finishBody
}

// finishedResult is one outcome's answer: state and outcome as stored, or
// the refusal (status, code, error) a single finish would have answered.
type finishedResult struct {
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	State   string `json:"state,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Status  int    `json:"status,omitempty"`
	Code    string `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
}

// maxFinishMany bounds the outcomes of one finish call.
const maxFinishMany = consumer.RemoteMaxClaim

// remoteFinishMany writes many outcomes at once (the embedded store
// commits them together), each answered as a single finish would be, and
// then claims as the claim call would: one round trip per batch of tasks
// for a worker whose handlers are short.
func (a *api) remoteFinishMany(w http.ResponseWriter, r *http.Request) {
	var b finishManyBody
	if err := decodeLimit(w, r, &b, 8<<20); err != nil {
		a.fail(w, r, err)
		return
	}
	if b.Instance == "" {
		a.fail(w, r, badInput("instance", "must not be empty"))
		return
	}
	if len(b.Outcomes) > maxFinishMany {
		a.fail(w, r, badInput("outcomes", "more than %d in one call", maxFinishMany))
		return
	}
	results := make([]finishedResult, len(b.Outcomes))
	var wg sync.WaitGroup
	for i, it := range b.Outcomes {
		res := &results[i]
		res.Key, res.Attempt = it.Key, it.Attempt
		if it.Instance != "" && it.Instance != b.Instance {
			res.Status, res.Error = http.StatusBadRequest, fmt.Sprintf("outcomes[%d].instance: must be the call's or absent", i)
			continue
		}
		if it.Key == "" {
			res.Status, res.Error = http.StatusBadRequest, fmt.Sprintf("outcomes[%d].key: must not be empty", i)
			continue
		}
		if it.Attempt < 1 {
			res.Status, res.Error = http.StatusBadRequest, fmt.Sprintf("outcomes[%d].attempt: must be at least 1", i)
			continue
		}
		ra := consumer.RemoteAttempt{Key: it.Key, WorkerID: r.PathValue("id"), Instance: b.Instance, Attempt: it.Attempt}
		ra.Kinds, _ = workerKinds(r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			doc, outcome, err := a.remote.Finish(r.Context(), ra, it.outcome())
			if err == nil {
				res.State, res.Outcome = string(doc.State), string(outcome)
				return
			}
			res.Status, res.Code, res.Error = refusal(err)
			if res.Status == http.StatusInternalServerError && r.Context().Err() == nil {
				a.log.Error("web: remote finish failed", "path", r.URL.Path, "key", it.Key, "err", err)
			}
		}()
	}
	wg.Wait()
	out := map[string]any{"results": results}
	if b.Claim != nil {
		jobs, err := a.claimFor(w, r, b.Instance, *b.Claim)
		if err != nil {
			// The outcomes are written: answer them, and the claim's
			// refusal beside.
			status, code, msg := refusal(err)
			out["claim_error"] = map[string]any{"status": status, "code": code, "error": msg}
			jobs = []remoteJob{}
		}
		out["jobs"] = jobs
	}
	writeJSON(w, http.StatusOK, out)
}

// refusal is the status, code and message the protocol answers err with:
// a refusal of the protocol's (with its code), bad input, an unknown task,
// or a server error (its message hidden; the caller logs it).
func refusal(err error) (status int, code, msg string) {
	switch {
	case errors.Is(err, task.ErrLeaseLost):
		return http.StatusConflict, lossCode(err), err.Error()
	case errors.Is(err, consumer.ErrNotRegistered):
		return http.StatusConflict, "not_registered", err.Error()
	case errors.Is(err, consumer.ErrKindNotAllowed):
		return http.StatusForbidden, "kind_not_allowed", err.Error()
	case errors.Is(err, task.ErrInvalid):
		return http.StatusBadRequest, "", reason(err)
	case errors.Is(err, task.ErrNotFound):
		return http.StatusNotFound, "", "task not found"
	default:
		return http.StatusInternalServerError, "", "internal error (see the server log)"
	}
}

// allowKinds refuses, for a worker credential limited to some kinds, any
// kind outside them.
func (a *api) allowKinds(r *http.Request, kinds []string) error {
	allowed, ok := workerKinds(r)
	if !ok || len(allowed) == 0 {
		return nil
	}
	for i, k := range kinds {
		if !slices.Contains(allowed, k) {
			return fmt.Errorf("kinds[%d]: %q is not among this credential's kinds: %w", i, k, consumer.ErrKindNotAllowed)
		}
	}
	return nil
}

// lossCode is the protocol's name of why an attempt is lost.
func lossCode(err error) string {
	switch {
	case errors.Is(err, task.ErrCancelled):
		return "cancelled"
	case errors.Is(err, task.ErrTaskDone):
		return "task_done"
	case errors.Is(err, task.ErrUnpinned):
		return "unpinned"
	case errors.Is(err, task.ErrNotFound):
		return "not_found"
	default:
		return "lease_lost"
	}
}

// remoteFail answers the protocol's refusals with their code, and the rest
// as fail does.
func (a *api) remoteFail(w http.ResponseWriter, r *http.Request, err error) {
	switch status, code, msg := refusal(err); {
	case errors.Is(err, task.ErrWorkerIDTaken):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error(), "code": "worker_id_taken"})
	case r.Context().Err() != nil:
		// The worker went away (killed, or its request timed out) while
		// its claim waited: nobody reads an answer, and it is no error.
	case code != "":
		writeJSON(w, status, map[string]string{"error": msg, "code": code})
	default:
		a.fail(w, r, err)
	}
}
