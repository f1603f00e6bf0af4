package consumer

// Remote workers: processes in any language that run tasks over HTTP
// (docs/http-api.md#remote-workers). RemoteWorkers claims, renews and
// finishes on their behalf with a Go worker's rules (claimRules, the
// ping package's renewal, the outcome writes of settle) and keeps nothing
// that outlives a call: the lease is the task document's and the
// registration the registry's, so any number of servers over one store
// serve the same remote workers.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/ping"
	"github.com/leasepool/leasepool/task"
)

// Bounds of the remote worker protocol.
const (
	// RemoteMaxClaim is the most tasks one claim call takes.
	RemoteMaxClaim = 256
	// RemoteMaxWait is the longest a claim call waits for a task.
	RemoteMaxWait = time.Minute
	// RemoteMaxHeld is the most attempts one heartbeat may ask about.
	RemoteMaxHeld = 4096
	// RemoteMaxLogLines is the most log lines one renew or finish carries.
	RemoteMaxLogLines = task.MaxLogLines
	// RemoteMaxClaimBytes bounds the payloads one claim call hands out
	// (at least one task's, whatever its size): 256 tasks of 1 MiB would
	// otherwise make one answer of 256 MiB.
	RemoteMaxClaimBytes = 8 << 20
)

// RemoteConfig configures RemoteWorkers.
type RemoteConfig struct {
	Store task.Store
	// HeartbeatInterval is how often a remote worker is asked to call
	// Heartbeat (default 2s); HeartbeatTimeout how long its registration
	// lasts after a call (default 10s: an HTTP client in a garbage
	// collected runtime misses a beat more often than a Go worker).
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// RetryPolicy is how long a failed attempt waits (default as
	// Config.RetryPolicy's).
	RetryPolicy RetryPolicy
	// Finished, when set, is called with a task that a claim or a finish
	// wrote finished: a claim that found expired attempts had used up its
	// retries (see Config.Reaped), or a remote attempt's last outcome. No
	// Go handler ran in this process to tell whoever waits on it (the flow
	// engine moves the task's flow on with it: flow.TaskFinished). It
	// runs on the call's goroutine and should return promptly.
	Finished func(ctx context.Context, t *task.Task)
	// SafetyPoll bounds a waiting claim's sleep between store queries
	// (default 1s): change events wake it sooner, but a lease that ends
	// is no write.
	SafetyPoll time.Duration
	Logger     *slog.Logger
}

// RemoteWorkers claims, renews and finishes attempts for remote workers.
// It is safe for concurrent use; its only state is a cache of the rate
// limits' slot locks and, while claims wait, one change stream.
type RemoteWorkers struct {
	cfg   RemoteConfig
	slots slotTable
	bell  doorbell
}

// NewRemoteWorkers returns the RemoteWorkers of cfg.
func NewRemoteWorkers(cfg RemoteConfig) (*RemoteWorkers, error) {
	if cfg.Store == nil {
		return nil, errors.New("consumer: RemoteConfig.Store is required")
	}
	setDefault(&cfg.HeartbeatInterval, 2*time.Second)
	setDefault(&cfg.HeartbeatTimeout, 10*time.Second)
	setDefault(&cfg.SafetyPoll, time.Second)
	if cfg.HeartbeatTimeout <= cfg.HeartbeatInterval {
		return nil, fmt.Errorf("consumer: RemoteConfig.HeartbeatTimeout (%s) must exceed HeartbeatInterval (%s)", cfg.HeartbeatTimeout, cfg.HeartbeatInterval)
	}
	if cfg.RetryPolicy == nil {
		cfg.RetryPolicy = ExponentialBackoff(time.Second, 5*time.Minute)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &RemoteWorkers{cfg: cfg}
	r.bell.store, r.bell.logger = cfg.Store, cfg.Logger
	return r, nil
}

// Close ends the change stream that wakes waiting claims (they poll
// after it) and waits for it to close.
func (r *RemoteWorkers) Close() { r.bell.close() }

// HeartbeatInterval and HeartbeatTimeout are what remote workers are told.
func (r *RemoteWorkers) HeartbeatInterval() time.Duration { return r.cfg.HeartbeatInterval }
func (r *RemoteWorkers) HeartbeatTimeout() time.Duration  { return r.cfg.HeartbeatTimeout }

// RemoteWorker is one remote worker process's heartbeat.
type RemoteWorker struct {
	ID, Instance string
	Kinds        []string
	Concurrency  int
	Running      int
	Host         string
	PID          int
	// Held is the attempts the process runs now.
	Held []RemoteAttempt
}

// RemoteAttempt names one attempt a remote worker holds: the holder of a
// lease, fenced by the attempt number.
type RemoteAttempt struct {
	Key, WorkerID, Instance string
	Attempt                 int
	// Kinds, when not empty, are the only kinds the caller may renew or
	// finish (a worker credential's); others fail with ErrKindNotAllowed.
	Kinds []string
}

// ErrKindNotAllowed refuses a renew or finish of a task whose kind the
// caller's credential does not cover.
var ErrKindNotAllowed = errors.New("kind not allowed for this credential")

func (a RemoteAttempt) holder() task.Holder {
	return task.Holder{TaskKey: a.Key, WorkerID: a.WorkerID, Instance: a.Instance, Attempt: a.Attempt}
}

// LostAttempt is a held attempt that is no longer its process's, and why
// (an error wrapping task.ErrLeaseLost, ErrCancelled, ErrTaskDone or
// ErrUnpinned; task.ErrNotFound when the task is gone).
type LostAttempt struct {
	RemoteAttempt
	Cause error
}

// Heartbeat registers w, or renews its registration, and reports which of
// its held attempts it has lost. It fails with an error wrapping
// task.ErrWorkerIDTaken while another live instance holds the id.
func (r *RemoteWorkers) Heartbeat(ctx context.Context, w RemoteWorker) (task.WorkerInfo, []LostAttempt, error) {
	if len(w.Held) > RemoteMaxHeld {
		return task.WorkerInfo{}, nil, fmt.Errorf("%w: held: more than %d attempts", task.ErrInvalid, RemoteMaxHeld)
	}
	if w.Concurrency < 0 || w.Running < 0 {
		return task.WorkerInfo{}, nil, fmt.Errorf("%w: concurrency and running must not be negative", task.ErrInvalid)
	}
	if err := validateRemoteKinds(w.Kinds); err != nil {
		return task.WorkerInfo{}, nil, err
	}
	now := r.cfg.Store.Now()
	info := task.WorkerInfo{
		ID: w.ID, Instance: w.Instance, Host: w.Host, PID: w.PID, StartedAt: now.UTC(),
		Kinds: w.Kinds, Concurrency: w.Concurrency, Running: w.Running,
		Heartbeat: now.UTC(), Until: now.Add(r.cfg.HeartbeatTimeout).UTC(),
	}
	if err := task.ValidateWorkerInfo(info); err != nil {
		return task.WorkerInfo{}, nil, err
	}
	if prev, ok, err := r.registration(ctx, w.ID); err != nil {
		return task.WorkerInfo{}, nil, err
	} else if ok && prev.Instance == w.Instance {
		info.StartedAt = prev.StartedAt
	}
	if err := r.cfg.Store.RegisterWorker(ctx, task.RegisterParams{Worker: info, Now: now}); err != nil {
		return task.WorkerInfo{}, nil, err
	}
	var lost []LostAttempt
	for _, a := range w.Held {
		a.WorkerID, a.Instance = w.ID, w.Instance
		doc, err := r.cfg.Store.Get(ctx, a.Key)
		switch {
		case errors.Is(err, task.ErrNotFound):
			lost = append(lost, LostAttempt{a, err})
			continue
		case err != nil:
			return info, lost, err
		}
		if cause := ping.New(r.cfg.Store, doc, a.holder(), r.cfg.Logger).Observe(doc); cause != nil {
			lost = append(lost, LostAttempt{a, cause})
		} else if i := doc.Entry(a.holder()); !doc.Attempts[i].Live(now) {
			lost = append(lost, LostAttempt{a, fmt.Errorf("lease expired: %w", task.ErrLeaseLost)})
		}
	}
	return info, lost, nil
}

// validateRemoteKinds refuses a kind that is no name, and leasepool's own
// kinds (flow timers and the like, task.DocumentPrefix): a remote worker
// running them would take them from the Go workers that must.
func validateRemoteKinds(kinds []string) error {
	for i, k := range kinds {
		field := fmt.Sprintf("kinds[%d]", i)
		if err := task.ValidateName(field, k); err != nil {
			return err
		}
		if strings.HasPrefix(k, task.DocumentPrefix) {
			return fmt.Errorf("%w: %s: %q is leasepool's own kind", task.ErrInvalid, field, k)
		}
	}
	return nil
}

// Unregister deletes id's registration if instance still holds it, and
// fails with ErrNotRegistered if it does not.
func (r *RemoteWorkers) Unregister(ctx context.Context, id, instance string) error {
	reg, ok, err := r.registration(ctx, id)
	if err != nil {
		return err
	}
	if !ok || reg.Instance != instance {
		return fmt.Errorf("worker %s instance %s: %w", id, instance, ErrNotRegistered)
	}
	return r.cfg.Store.UnregisterWorker(ctx, id, instance)
}

func (r *RemoteWorkers) registration(ctx context.Context, id string) (task.WorkerInfo, bool, error) {
	ws, err := r.cfg.Store.Workers(ctx)
	if err != nil {
		return task.WorkerInfo{}, false, err
	}
	for _, w := range ws {
		if w.ID == id {
			return w, true, nil
		}
	}
	return task.WorkerInfo{}, false, nil
}
