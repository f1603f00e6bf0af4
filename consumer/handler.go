package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Job is what a handler gets: the task as claimed, the attempt number (the
// fencing token; carry it on side effects so a stale holder can be told
// apart), and the id of the worker running it.
type Job struct {
	Task     *task.Task
	Attempt  int
	WorkerID string

	holder task.Holder
	lease  interface{ Remaining() time.Duration }
	out    output

	mu        sync.Mutex
	succeeded *task.Task // see Succeeded
}

// Succeeded tells the job that its attempt's success was written, as
// doc, by a write of the handler's own: the attempt finished in the same
// transaction as the handler's business write (sqlitestore.Tx.Succeed
// calls it once that commits). The worker then writes no outcome for the
// attempt: the stored success stands, whatever the handler returns. A doc
// that does not show this attempt succeeded is ignored.
func (j *Job) Succeeded(doc *task.Task) {
	if doc == nil || doc.Key != j.holder.TaskKey {
		return
	}
	if i := doc.Entry(j.holder); i < 0 || doc.Attempts[i].State != task.AttemptSuccess {
		return
	}
	j.mu.Lock()
	j.succeeded = doc
	j.mu.Unlock()
}

// settled is the document Succeeded was told, or nil.
func (j *Job) settled() *task.Task {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.succeeded
}

// Holder is the identity this attempt's lease and locks carry: task key,
// worker id, attempt and the worker process's instance id.
func (j *Job) Holder() task.Holder { return j.holder }

// LeaseRemaining is how long the handler may still count on its lease, as
// renewed so far (zero when it is lost). Work that outlives the worker (a
// child process) should be stopped by then.
func (j *Job) LeaseRemaining() time.Duration {
	if j.lease == nil {
		return 0
	}
	return max(j.lease.Remaining(), 0)
}

// Handler runs one attempt of a task. Its context is cancelled when the
// lease is lost (preempted, unpinned), the task is cancelled, or the worker
// shuts down; context.Cause tells which. Returning nil records success; an
// error records failure, unless it is Retryable (retried here within the
// lease) or a Snooze (released without spending a retry).
type Handler interface {
	Handle(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

func (f HandlerFunc) Handle(ctx context.Context, job *Job) error { return f(ctx, job) }

// Middleware wraps a handler: metrics, tracing, logging, hooks around
// every run. It sees the handler's error, before the outcome is written.
type Middleware func(Handler) Handler

// Mux routes jobs to handlers by task kind, through its middleware.
type Mux struct {
	mu         sync.RWMutex
	handlers   map[string]Handler // as registered
	wrapped    map[string]Handler // with the middleware applied
	middleware []Middleware
	notFound   Handler
	instant    []string // registered with RegisterInstant
}

// NewMux returns an empty Mux. Jobs of a kind with no handler fail with
// ErrUnknownKind unless NotFound sets another handler.
func NewMux() *Mux {
	m := &Mux{handlers: map[string]Handler{}, wrapped: map[string]Handler{}}
	m.notFound = HandlerFunc(func(_ context.Context, job *Job) error {
		return fmt.Errorf("kind %q: %w", job.Task.Kind, ErrUnknownKind)
	})
	return m
}

// Register registers h for kind. It panics when kind is empty, h is nil,
// or kind already has a handler, as http.ServeMux does: these are
// programming errors found at startup.
func (m *Mux) Register(kind string, h Handler) {
	if kind == "" || h == nil {
		panic("consumer: Register needs a kind and a handler")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.handlers[kind]; dup {
		panic(fmt.Sprintf("consumer: kind %q registered twice", kind))
	}
	m.handlers[kind] = h
	m.wrapped[kind] = m.wrap(h)
}

// RegisterFunc registers f for kind.
func (m *Mux) RegisterFunc(kind string, f func(context.Context, *Job) error) {
	m.Register(kind, HandlerFunc(f))
}

// RegisterInstant is Register for a kind whose tasks only record that
// their time came, as a flow's timers do: a consumer claims one that falls
// due even while every slot runs a handler (Config.InstantKinds). h must
// return promptly: InstantSlots handlers that block fill the lane, and
// the kind's tasks then wait for the worker's slots.
func (m *Mux) RegisterInstant(kind string, h Handler) {
	m.Register(kind, h)
	m.mu.Lock()
	m.instant = append(m.instant, kind)
	m.mu.Unlock()
}

// InstantKinds lists the kinds registered with RegisterInstant.
func (m *Mux) InstantKinds() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.instant)
}

// Use appends middleware; the first added is the outermost. It applies to
// handlers registered before and after.
func (m *Mux) Use(mw ...Middleware) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.middleware = append(m.middleware, mw...)
	for k, h := range m.handlers {
		m.wrapped[k] = m.wrap(h)
	}
}

// NotFound sets the handler for jobs of kinds with no handler (it runs
// through the middleware too).
func (m *Mux) NotFound(h Handler) {
	m.mu.Lock()
	m.notFound = h
	m.mu.Unlock()
}

func (m *Mux) wrap(h Handler) Handler {
	for i := len(m.middleware) - 1; i >= 0; i-- {
		h = m.middleware[i](h)
	}
	return h
}

// Kinds lists the registered kinds.
func (m *Mux) Kinds() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	kinds := make([]string, 0, len(m.handlers))
	for k := range m.handlers {
		kinds = append(kinds, k)
	}
	return kinds
}

// Handle runs the handler registered for the job's kind.
func (m *Mux) Handle(ctx context.Context, job *Job) error {
	m.mu.RLock()
	h, ok := m.wrapped[job.Task.Kind]
	if !ok {
		h = m.wrap(m.notFound)
	}
	m.mu.RUnlock()
	return h.Handle(ctx, job)
}

// ErrUnknownKind is returned for a task whose kind has no handler.
var ErrUnknownKind = errors.New("no handler for kind")

type retryableError struct{ err error }

func (e retryableError) Error() string { return "retryable: " + e.err.Error() }
func (e retryableError) Unwrap() error { return e.err }

// Retryable marks err as worth retrying: the worker runs the handler again
// with backoff while it still holds the lease.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return retryableError{err}
}

// IsRetryable reports whether err was marked with Retryable.
func IsRetryable(err error) bool {
	var r retryableError
	return errors.As(err, &r)
}

// SnoozeError asks the worker to give the task back without spending a
// retry and not to start it again before Delay has passed (an offline
// device, a busy downstream).
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snooze %s", e.Delay) }

// Snooze returns a *SnoozeError for d.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// RateLimitError is a handler's word that a downstream is rate limited
// (as asynq's RateLimitError): the task is given back without spending a
// retry and starts again after RetryIn. It is a SnoozeError to the worker.
type RateLimitError struct{ RetryIn time.Duration }

func (e *RateLimitError) Error() string { return fmt.Sprintf("rate limited; retry in %s", e.RetryIn) }

// Unwrap makes it a *SnoozeError for errors.As.
func (e *RateLimitError) Unwrap() error { return &SnoozeError{Delay: e.RetryIn} }

// RateLimited returns a *RateLimitError for d.
func RateLimited(d time.Duration) error { return &RateLimitError{RetryIn: d} }
