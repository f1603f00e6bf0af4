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
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

func (a *api) remoteRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/v1/workers/{id}", a.write(a.remoteHeartbeat))
	mux.HandleFunc("DELETE /api/v1/workers/{id}", a.write(a.remoteUnregister))
	mux.HandleFunc("POST /api/v1/workers/{id}/claim", a.write(a.remoteClaim))
	mux.HandleFunc("POST /api/v1/workers/{id}/jobs/{key}/renew", a.write(a.remoteRenew))
	mux.HandleFunc("POST /api/v1/workers/{id}/jobs/{key}/finish", a.write(a.remoteFinish))
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
}

// defaultClaimWait is a claim's wait when the body names none.
const defaultClaimWait = 20 * time.Second

func (a *api) remoteClaim(w http.ResponseWriter, r *http.Request) {
	var b claimBody
	if err := decode(w, r, &b); err != nil {
		a.fail(w, r, err)
		return
	}
	c := consumer.RemoteClaim{ID: r.PathValue("id"), Instance: b.Instance, Kinds: b.Kinds, Max: 1, Wait: defaultClaimWait}
	if b.Max != nil {
		c.Max = *b.Max
	}
	if b.WaitMS != nil {
		c.Wait = time.Duration(*b.WaitMS) * time.Millisecond
	}
	if b.Instance == "" {
		a.fail(w, r, badInput("instance", "must not be empty"))
		return
	}
	if allowed, ok := workerKinds(r); ok && len(allowed) > 0 {
		if len(c.Kinds) == 0 {
			c.Kinds = allowed
		} else if err := a.allowKinds(r, c.Kinds); err != nil {
			a.remoteFail(w, r, err)
			return
		}
	}
	// The answer may come a whole wait later than the server's write
	// bound allows for.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(c.Wait + a.writeTimeout))
	jobs, err := a.remote.Claim(r.Context(), c)
	if err != nil {
		a.remoteFail(w, r, err)
		return
	}
	out := make([]remoteJob, 0, len(jobs))
	for _, j := range jobs {
		t := j.Task
		p := t.Payload
		if len(p) == 0 {
			p = json.RawMessage("null")
		}
		out = append(out, remoteJob{
			Key: t.Key, Kind: t.Kind, Attempt: j.Holder.Attempt, Payload: p, Priority: t.Priority,
			LeaseUntil: j.LeaseUntil().UTC(), LeaseMS: time.Duration(t.WorkerTimeout).Milliseconds(),
			RenewMS: time.Duration(t.PingInterval).Milliseconds(), CreatedAt: t.CreatedAt.UTC(),
			Traceparent: t.Trace.Traceparent, Tracestate: t.Trace.Tracestate,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": out})
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
		until = doc.Workers[i].LeaseUntil.UTC()
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
	o := consumer.RemoteOutcome{Outcome: consumer.Outcome(b.Outcome), Result: b.Result, Error: b.Error,
		Snooze: time.Duration(b.SnoozeMS) * time.Millisecond, Log: b.Log}
	doc, outcome, err := a.remote.Finish(r.Context(), ra, o)
	if err != nil {
		a.remoteFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"state": string(doc.State), "outcome": string(outcome)})
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
	code, status := "", http.StatusConflict
	switch {
	case errors.Is(err, task.ErrLeaseLost):
		code = lossCode(err)
	case errors.Is(err, consumer.ErrNotRegistered):
		code = "not_registered"
	case errors.Is(err, task.ErrWorkerIDTaken):
		code = "worker_id_taken"
	case errors.Is(err, consumer.ErrKindNotAllowed):
		code, status = "kind_not_allowed", http.StatusForbidden
	default:
		a.fail(w, r, err)
		return
	}
	writeJSON(w, status, map[string]string{"error": err.Error(), "code": code})
}
