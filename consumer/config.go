package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Store is the task store. Required.
	Store task.Store
	// Handler runs claimed tasks, usually a *Mux. Required.
	Handler Handler
	// WorkerID names this worker in leases and pins. Default
	// "<host>-<pid>-<random>".
	WorkerID string
	// Kinds limits the kinds claimed. Default: the kinds registered on the
	// Handler when it is a *Mux, otherwise every kind.
	Kinds []string
	// Concurrency is how many handlers run at once. Default 8.
	Concurrency int
	// InstantKinds are kinds whose tasks only record that their time came
	// (a flow's timers): one that falls due is claimed in a lane of
	// InstantSlots beside the Concurrency slots (in a free slot when the
	// lane is full), so that a busy worker does not hold it back for a
	// handler to end. Their handlers must return promptly: one that
	// blocks holds its lane slot as long as it runs.
	// Default: the kinds registered with Mux.RegisterInstant on the
	// Handler when it is a *Mux.
	InstantKinds []string
	// HeapSize bounds the claim heap. Default 1000.
	HeapSize int
	// PageSize is the candidate query's page size. Default 200.
	PageSize int
	// PollInterval is how often to query for work when the store cannot
	// push changes. Default 500ms.
	PollInterval time.Duration
	// SafetyNetInterval is how often to query for work even with a healthy
	// change stream, to catch what an event did not carry. Default 30s.
	SafetyNetInterval time.Duration
	// ShutdownTimeout is how long Stop lets running handlers finish before
	// cancelling them and releasing their leases. Default
	// task.DefaultWorkerTimeout (4s): a longer one lets more handlers finish,
	// but hands their tasks over later than a crash of this worker would.
	ShutdownTimeout time.Duration
	// LocalRetries is how many times a Retryable error is retried within
	// the lease before the attempt fails. Default 3; -1 for none.
	LocalRetries int
	// RetryBackoff is the first local retry's delay, doubling after.
	// Default 100ms.
	RetryBackoff time.Duration
	// RetryPolicy says how long a task waits after a failed attempt before
	// any worker may claim it again (written as its next claim time).
	// Default ExponentialBackoff(time.Second, 5*time.Minute); NoBackoff
	// retries at once. Expired leases (crashed workers) are retried at once.
	RetryPolicy RetryPolicy
	// Reaped, when set, is called with a task this worker found with
	// expired leases and no retries left, after writing it failed: no
	// handler ran, so nothing else tells the failure to whoever waits on
	// it (the flow engine moves the task's flow on with it). It runs on
	// the claim's goroutine and should return promptly. Nil: nothing.
	Reaped func(ctx context.Context, t *task.Task)
	// HeartbeatInterval is how often the worker renews its registry
	// record. Default 1s.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long the record holds the worker id after
	// the last heartbeat; until then another process under the same id
	// refuses to start. Default 4s; must exceed HeartbeatInterval.
	HeartbeatTimeout time.Duration
	// Logger receives the worker's logs. Default slog.Default().
	Logger *slog.Logger
	// Observer is told of claims, claim conflicts and outcomes (metrics).
	// Default: none.
	Observer Observer
	// ClaimSpread is how long each worker stands by per rank before it
	// claims a task it is not the preferred worker for: the live workers
	// able to run a task rank it alike (rendezvous hashing of its key
	// over the registry), the first claims at once, the next after
	// ClaimSpread, and so on up to 10 ranks, so that about one claim is
	// tried per task however many workers watch. Default 20ms; negative:
	// every worker claims at once. Where change events take longer to
	// arrive, the step grows to twice the 99th percentile of their recent
	// lags (at most 100ms), so that the next rank hears the claim before
	// its turn.
	ClaimSpread time.Duration
}

// checkAndFillDefaults refuses a bad config and sets the defaults of
// its zero fields.
func (c *Config) checkAndFillDefaults() error {
	if c.Store == nil {
		return errors.New("consumer config: Store is required")
	}
	if c.Handler == nil {
		return errors.New("consumer config: Handler is required")
	}
	fields := []struct {
		name string
		v    int64
	}{
		{"Concurrency", int64(c.Concurrency)}, {"HeapSize", int64(c.HeapSize)}, {"PageSize", int64(c.PageSize)},
		{"PollInterval", int64(c.PollInterval)}, {"SafetyNetInterval", int64(c.SafetyNetInterval)},
		{"ShutdownTimeout", int64(c.ShutdownTimeout)}, {"RetryBackoff", int64(c.RetryBackoff)},
		{"HeartbeatInterval", int64(c.HeartbeatInterval)}, {"HeartbeatTimeout", int64(c.HeartbeatTimeout)},
	}
	for _, f := range fields {
		if f.v < 0 {
			return fmt.Errorf("consumer config: %s must not be negative", f.name)
		}
	}
	if c.LocalRetries < -1 {
		return errors.New("consumer config: LocalRetries must be -1 or more")
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "worker"
		}
		c.WorkerID = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if err := task.ValidateName("WorkerID", c.WorkerID); err != nil {
		return fmt.Errorf("consumer config: %w", err)
	}
	if len(c.Kinds) == 0 {
		if m, ok := c.Handler.(*Mux); ok {
			c.Kinds = m.Kinds()
		}
	}
	if len(c.InstantKinds) == 0 {
		if m, ok := c.Handler.(*Mux); ok {
			c.InstantKinds = m.InstantKinds()
		}
	}
	setDefault(&c.Concurrency, 8)
	setDefault(&c.HeapSize, 1000)
	setDefault(&c.PageSize, 200)
	setDefault(&c.PollInterval, 500*time.Millisecond)
	setDefault(&c.SafetyNetInterval, 30*time.Second)
	setDefault(&c.ShutdownTimeout, task.DefaultWorkerTimeout)
	setDefault(&c.RetryBackoff, 100*time.Millisecond)
	setDefault(&c.HeartbeatInterval, time.Second)
	setDefault(&c.HeartbeatTimeout, 4*time.Second)
	setDefault(&c.ClaimSpread, preempt.DefaultSpread.Step)
	if c.HeartbeatTimeout <= c.HeartbeatInterval {
		return fmt.Errorf("consumer config: HeartbeatTimeout (%s) must exceed HeartbeatInterval (%s)", c.HeartbeatTimeout, c.HeartbeatInterval)
	}
	if c.RetryPolicy == nil {
		c.RetryPolicy = ExponentialBackoff(time.Second, 5*time.Minute)
	}
	switch c.LocalRetries {
	case 0:
		c.LocalRetries = 3
	case -1:
		c.LocalRetries = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	return nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// RetryPolicy returns how long a task waits after a failed attempt;
// failures counts its failed and expired attempts so far, this one
// included, and err is this attempt's error.
type RetryPolicy func(failures int, err error) time.Duration

// NoBackoff retries a failed task at once.
func NoBackoff(int, error) time.Duration { return 0 }

// ExponentialBackoff waits first after the first failure, doubling with
// each further one up to max, each delay jittered by ±25% so that tasks
// failing together do not come back together.
func ExponentialBackoff(first, max time.Duration) RetryPolicy {
	return func(failures int, _ error) time.Duration {
		if first <= 0 {
			return 0
		}
		d := first
		for i := 1; i < failures && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
	}
}
