// Package web is leasepool's HTTP surface: an http.Handler that sees only a
// task.Store, so it mounts in any server (`leasepool serve` runs one). It
// serves, under /api/v1, the tasks API (publish, get, list with filters
// and cursors, cancel, retry, bulk), the worker registry, the devices, the
// queue's stats, the lifecycle events as Server-Sent Events, and the flow
// controls (pauses, rate limits) and schedule pause/resume; and at / the
// dashboard (server-rendered pages from html/template with embedded
// assets). Both sit behind one Guard (a Host check against DNS
// rebinding, then bearer-token or basic-auth login with full and
// read-only credentials), one read-only switch and one cross-origin
// guard; NewServer bounds the connections.
package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// Config is what the handler serves and who may use it. Every request
// passes Guard first: the Host check, then the login, then the
// credential's scope.
type Config struct {
	// Store is read and changed by every request (required).
	Store task.Store
	// Token, when set, must come with every request as
	// "Authorization: Bearer <Token>" (the scheme in any case); others
	// get 401.
	Token string
	// BasicUser and BasicPassword, when set (both or neither), let a
	// browser log in with HTTP basic auth; a request may then carry either
	// the bearer token or these.
	BasicUser     string
	BasicPassword string
	// ReadToken, and ReadBasicUser with ReadBasicPassword, are read-only
	// credentials beside the full ones (either may be set alone): a
	// request carrying one may GET and HEAD everything (API, pages, event
	// stream, /metrics); any other method gets 403 "this credential is
	// read-only", and the pages show no write controls. Each must differ
	// from its full counterpart.
	ReadToken         string
	ReadBasicUser     string
	ReadBasicPassword string
	// AllowedHosts are host names (or IP addresses), without a port,
	// served besides the loopback ones: localhost, any 127.x.y.z and
	// [::1], each with any port. The Host check runs when no credentials
	// are set or when AllowedHosts is not empty; a request whose Host is
	// none of these gets 421 before it is authenticated, which defeats
	// DNS rebinding (a page whose name resolves to 127.0.0.1). With
	// credentials and no AllowedHosts, any Host is served.
	AllowedHosts []string
	// WorkerToken, when set, is a third credential, for remote workers
	// (docs/http-api.md#remote-workers): a request carrying it may only
	// register, claim, renew and finish, and only tasks of WorkerKinds
	// (every kind when empty); anything else gets 403. It must differ
	// from Token and ReadToken.
	WorkerToken string
	WorkerKinds []string
	// Remote serves the remote worker protocol; nil: NewHandler makes one
	// over Store with the defaults, closed when Stop is.
	Remote *consumer.RemoteWorkers
	// AllowAddressHosts also serves, when the Host check runs, any Host
	// that is an IP address literal: DNS rebinding needs a name, and a
	// page can only send an address as its Host from that address
	// itself. A worker's metrics server listening on every interface sets
	// it, so that a scraper reaches it by address.
	AllowAddressHosts bool
	// ReadOnly refuses every write with 403, whatever the credential.
	ReadOnly bool
	// Metrics, when set, is served at GET /metrics behind the same guard.
	Metrics http.Handler
	// Limits are the server's connection limits (NewServer); the event
	// stream bounds each of its writes by Limits.WriteTimeout.
	Limits ServerLimits
	// Logger logs failed requests and writes (default slog.Default()).
	Logger *slog.Logger
	// Heartbeat is how often an idle event stream sends a comment
	// (default DefaultHeartbeat; must not be negative).
	Heartbeat time.Duration
	// Stop, when closed, ends every event stream. http.Server.Shutdown
	// waits for connections to go idle, which a stream never does: close
	// Stop from Server.RegisterOnShutdown. Nil: streams end only with
	// their requests.
	Stop <-chan struct{}
}

// maxBody bounds a request body: every body this API reads is one small
// JSON object.
const maxBody = 64 << 10

// NewHandler returns the handler of cfg: the API under /api/v1/, the
// dashboard at /, and cfg.Metrics at /metrics, all behind Guard (see
// Config for the Host check and the credentials' scopes) and the
// cross-origin guard. Serve it with NewServer's connection limits.
func NewHandler(cfg Config) (http.Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("web: Config.Store is required")
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Heartbeat < 0:
		return nil, fmt.Errorf("web: Config.Heartbeat (%s) must not be negative", cfg.Heartbeat)
	case cfg.Heartbeat == 0:
		cfg.Heartbeat = DefaultHeartbeat
	}
	a := &api{store: cfg.Store, log: cfg.Logger, readOnly: cfg.ReadOnly, heartbeat: cfg.Heartbeat, stop: cfg.Stop,
		writeTimeout: cfg.Limits.withDefaults().WriteTimeout, remote: cfg.Remote}
	if a.remote == nil {
		// A remote worker's step tasks tell their flows here: the flow
		// middleware runs in Go workers only.
		finished := func(ctx context.Context, t *task.Task) {
			if err := flow.TaskFinished(ctx, cfg.Store, t, cfg.Logger); err != nil {
				cfg.Logger.Warn("flow of a finished task not moved on; the reconciler will", slog.String("task", t.Key), slog.Any("error", err))
			}
		}
		rw, err := consumer.NewRemoteWorkers(consumer.RemoteConfig{Store: cfg.Store, Logger: cfg.Logger, Finished: finished})
		if err != nil {
			return nil, err
		}
		a.remote = rw
		if cfg.Stop != nil {
			go func() { <-cfg.Stop; rw.Close() }()
		}
	}
	mux := http.NewServeMux()
	d, err := newDashboard(cfg)
	if err != nil {
		return nil, err
	}
	d.routes(mux)
	mux.HandleFunc("POST /api/v1/tasks", a.write(a.publish))
	mux.HandleFunc("GET /api/v1/tasks", a.listTasks)
	mux.HandleFunc("POST /api/v1/tasks/bulk", a.write(a.bulk))
	mux.HandleFunc("POST /api/v1/tasks/batch", a.write(a.publishBatch))
	mux.HandleFunc("GET /api/v1/tasks/{key}", a.getTask)
	mux.HandleFunc("POST /api/v1/tasks/{key}/cancel", a.write(a.cancelTask))
	mux.HandleFunc("POST /api/v1/tasks/{key}/retry", a.write(a.retryTask))
	mux.HandleFunc("GET /api/v1/workers", a.listWorkers)
	mux.HandleFunc("GET /api/v1/devices", a.listDevices)
	mux.HandleFunc("GET /api/v1/stats", a.stats)
	mux.HandleFunc("GET /api/v1/events", a.streamEvents)
	mux.HandleFunc("POST /api/v1/flows", a.write(a.publishFlow))
	mux.HandleFunc("GET /api/v1/flows", a.listFlows)
	mux.HandleFunc("GET /api/v1/flows/{key}", a.getFlow)
	mux.HandleFunc("POST /api/v1/flows/{key}/cancel", a.write(a.cancelFlow))
	mux.HandleFunc("POST /api/v1/flows/{key}/retry", a.write(a.retryFlow))
	mux.HandleFunc("POST /api/v1/flows/{key}/signal/{step}", a.write(a.signalFlow))
	mux.HandleFunc("GET /api/v1/pauses", a.listPauses)
	mux.HandleFunc("POST /api/v1/pauses", a.write(a.pause))
	mux.HandleFunc("DELETE /api/v1/pauses", a.write(a.resume))
	mux.HandleFunc("GET /api/v1/limits", a.listLimits)
	mux.HandleFunc("PUT /api/v1/limits", a.write(a.setLimit))
	mux.HandleFunc("DELETE /api/v1/limits", a.write(a.removeLimit))
	mux.HandleFunc("GET /api/v1/schedules", a.listSchedules)
	mux.HandleFunc("POST /api/v1/schedules/{name}/pause", a.write(a.pauseSchedule))
	mux.HandleFunc("POST /api/v1/schedules/{name}/resume", a.write(a.resumeSchedule))
	mux.HandleFunc("GET /api/v1/triggers", a.listTriggers)
	mux.HandleFunc("POST /api/v1/triggers", a.write(a.addTrigger))
	mux.HandleFunc("DELETE /api/v1/triggers/{name}", a.write(a.removeTrigger))
	mux.HandleFunc("POST /api/v1/triggers/{name}/pause", a.write(a.pauseTrigger))
	mux.HandleFunc("POST /api/v1/triggers/{name}/resume", a.write(a.resumeTrigger))
	mux.HandleFunc("PUT /api/v1/devices/{id}/labels", a.write(a.putDeviceLabels))
	mux.HandleFunc("PATCH /api/v1/devices/{id}/labels", a.write(a.patchDeviceLabels))
	mux.HandleFunc("POST /api/v1/devices/{id}/approve", a.write(a.approveDevice))
	mux.HandleFunc("DELETE /api/v1/devices/{id}", a.write(a.forgetDevice))
	mux.HandleFunc("POST /api/v1/devices/{id}/credential", a.write(a.postDeviceCredential))
	mux.HandleFunc("DELETE /api/v1/devices/{id}/credential", a.write(a.deleteDeviceCredential))
	mux.HandleFunc("GET /api/v1/rollouts", a.listRollouts)
	mux.HandleFunc("POST /api/v1/rollouts", a.write(a.createRollout))
	mux.HandleFunc("GET /api/v1/rollouts/{name}", a.getRollout)
	mux.HandleFunc("GET /api/v1/rollouts/{name}/devices", a.rolloutDevices)
	mux.HandleFunc("DELETE /api/v1/rollouts/{name}", a.write(a.deleteRollout))
	mux.HandleFunc("POST /api/v1/rollouts/{name}/pause", a.write(a.rolloutAction("paused", a.pauseRollout)))
	mux.HandleFunc("POST /api/v1/rollouts/{name}/resume", a.write(a.rolloutAction("resumed", a.resumeRollout)))
	mux.HandleFunc("POST /api/v1/rollouts/{name}/cancel", a.write(a.rolloutAction("cancelled", a.cancelRollout)))
	mux.HandleFunc("POST /api/v1/rollouts/{name}/approve", a.write(a.rolloutAction("approved", a.approveRollout)))
	mux.HandleFunc("POST /api/v1/rollouts/{name}/retry-failed", a.write(a.rolloutAction("retried", a.retryFailedRollout)))
	a.remoteRoutes(mux)
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	// Browsers send basic-auth credentials (and cookies) with cross-site
	// requests too: refuse every cross-origin write, API or form, before
	// it is authenticated. Scripts (curl, Go) send neither Origin nor
	// Sec-Fetch-Site and pass.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused (Origin or Sec-Fetch-Site names another site)")
	}))
	return Guard(cfg, cop.Handler(jsonErrors(mux)))
}

// api holds the handlers' shared state.
type api struct {
	store     task.Store
	log       *slog.Logger
	readOnly  bool
	heartbeat time.Duration
	stop      <-chan struct{}
	// writeTimeout bounds each write of an event stream.
	writeTimeout time.Duration
	remote       *consumer.RemoteWorkers
}

// write guards a handler that changes the store: 403 when the server or
// the request's credential is read-only (Guard refuses the latter first).
func (a *api) write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.readOnly {
			writeError(w, http.StatusForbidden, "this server is read-only")
			return
		}
		if readOnlyRequest(r) {
			writeError(w, http.StatusForbidden, "this credential is read-only")
			return
		}
		h(w, r)
	}
}

// errTooLarge is a request body over its limit: 413.
var errTooLarge = errors.New("request body too large")

// fail answers err: 413 for a body over its limit, 400 for invalid input
// (already naming the field), 404
// for an unknown task or schedule, 409 for a cancel or retry its task's
// state refuses, 410 for an event token past the store's history, 501 for
// what the store cannot do, 500 (logged, not shown) for anything else.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, errTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, strings.TrimPrefix(err.Error(), errTooLarge.Error()+": "))
	case errors.As(err, &tooLarge): // a reader other than decode's hit the limit
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body: larger than %d bytes", tooLarge.Limit))
	case errors.Is(err, task.ErrInvalid):
		writeError(w, http.StatusBadRequest, reason(err))
	case errors.Is(err, task.ErrNotFound):
		writeError(w, http.StatusNotFound, "task not found")
	case errors.Is(err, flow.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, task.ErrFinished), errors.Is(err, task.ErrNotFinished),
		errors.Is(err, flow.ErrFinished), errors.Is(err, flow.ErrNotFinished):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, task.ErrHistoryLost):
		writeError(w, http.StatusGone, "events: the store no longer has history from this token: list the tasks again and follow from now")
	case errors.Is(err, task.ErrWatchUnsupported):
		writeError(w, http.StatusNotImplemented, "events: this store cannot stream changes")
	case errors.Is(err, schedule.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case triggerStatus(err) != 0:
		writeError(w, triggerStatus(err), err.Error())
	default:
		a.log.Error("web: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error (see the server log)")
	}
}

// writeJSON writes v as the JSON response with status code. No answer
// is for a cache, and none is to be read as anything but JSON.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}

// errorBody is every error response: one line, naming the field when the
// input was bad.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Error: strings.ReplaceAll(msg, "\n", " ")})
}

// badInput is a task.ErrInvalid naming field, so fail answers 400.
func badInput(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, fmt.Sprintf(format, args...))
}

// reason is an invalid-input error without its leading "invalid: ".
func reason(err error) string {
	return strings.TrimPrefix(err.Error(), task.ErrInvalid.Error()+": ")
}

// jsonErrors serves mux, turning its own plain-text 404 and 405 (no
// pattern matched) into JSON errors; its Allow header stays.
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := mux.Handler(r); pattern == "" {
			h.ServeHTTP(&statusOnly{ResponseWriter: w}, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// statusOnly keeps the status and headers ServeMux's error handlers set and
// replaces their text body with errorBody.
type statusOnly struct {
	http.ResponseWriter
	wrote bool
}

func (s *statusOnly) WriteHeader(code int) {
	if s.wrote {
		return
	}
	s.wrote = true
	msg := strings.ToLower(http.StatusText(code))
	if code == http.StatusMethodNotAllowed {
		msg += "; allowed: " + s.Header().Get("Allow")
	}
	writeError(s.ResponseWriter, code, msg)
}

func (s *statusOnly) Write(b []byte) (int, error) {
	if !s.wrote {
		s.WriteHeader(http.StatusOK)
	}
	return len(b), nil // the text body is dropped
}
