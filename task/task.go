// Package task is leasepool's data model: the task document, its options and
// their validation, the state derived from its worker list, the mutations
// that the four operations (publish, claim, ping, finish) apply to it, the
// Store interface every backend implements, and the sentinel errors callers
// branch on. It imports no backend and no other leasepool package.
package task

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/leasepool/leasepool/internal/tracing"
)

// State is a task's state, derived from its worker list and stored so that
// backends can index it.
type State string

const (
	StatePending   State = "pending"   // no live worker, may be claimed (perhaps later)
	StateRunning   State = "running"   // at least one live RUNNING worker
	StateSucceeded State = "succeeded" // success_worker_cnt workers succeeded
	StateFailed    State = "failed"    // more unexpected failures than max_unexpected_retries
	StateCancelled State = "cancelled" // cancelled by a user
)

// Finished reports whether no worker will ever claim a task in state s again.
func (s State) Finished() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// ParseState parses a state name as the CLI and JSON spell it.
func ParseState(s string) (State, error) {
	switch st := State(s); st {
	case StatePending, StateRunning, StateSucceeded, StateFailed, StateCancelled:
		return st, nil
	}
	return "", fmt.Errorf("%w: state: %q is not one of pending, running, succeeded, failed, cancelled", ErrInvalid, s)
}

// AttemptState is the state of one attempt in a task's worker list.
// EXPIRED is not stored: it is a RUNNING entry whose lease has passed.
type AttemptState string

const (
	AttemptRunning AttemptState = "RUNNING"
	AttemptSuccess AttemptState = "SUCCESS"
	AttemptFail    AttemptState = "FAIL"
	AttemptExpired AttemptState = "EXPIRED" // recorded when a claim drops an expired entry
)

// Attempt is one claim of a task by one worker: an entry of the task's
// worker list (JSON "workers"), from its claim to its outcome.
type Attempt struct {
	WorkerID string `json:"worker_id"`
	// Instance is the claiming process's instance id (see WorkerInfo), so
	// that two processes under one worker id never renew or finish each
	// other's attempts.
	Instance string       `json:"instance,omitempty"`
	State    AttemptState `json:"state"`
	// Attempt is the fencing token: it grows with every claim of the task.
	Attempt    int       `json:"attempt"`
	LeaseUntil time.Time `json:"lease_until"`
	StartedAt  time.Time `json:"started_at"`
	// ClaimVersion is the version the claim's write stored, so that a
	// reader holding a later document can tell which write made each
	// attempt (package events, where a change stream looks documents up
	// after later writes).
	ClaimVersion int64     `json:"claim_version,omitempty"`
	EndedAt      time.Time `json:"ended_at,omitzero"`
	Error        string    `json:"error,omitempty"`
	// Result and Log are what the attempt's handler recorded (see Record);
	// they are replaced, never changed in place.
	Result     json.RawMessage `json:"result,omitempty"`
	Log        []LogLine       `json:"log,omitempty"`
	LogDropped int             `json:"log_dropped,omitempty"`
	// OutputDropped says that History left out this entry's result and
	// log and cut its error to the first line (MaxHistoryOutput).
	OutputDropped bool `json:"output_dropped,omitempty"`
	// Slots are the concurrency-limit slot locks (LockConcurrency) the
	// claim took, held with the lease: renewals extend them, the finish
	// frees them, and a dead holder's run out at its lease's end.
	Slots []string `json:"slots,omitempty"`
}

// Holder is the holder identity of w's attempt of the task with key.
func (w Attempt) Holder(key string) Holder {
	return Holder{TaskKey: key, WorkerID: w.WorkerID, Attempt: w.Attempt, Instance: w.Instance}
}

// Live reports whether w is RUNNING with a lease still ahead of now.
func (w Attempt) Live(now time.Time) bool {
	return w.State == AttemptRunning && now.Before(w.LeaseUntil)
}

// Expired reports whether w is RUNNING but its lease has passed.
func (w Attempt) Expired(now time.Time) bool {
	return w.State == AttemptRunning && !now.Before(w.LeaseUntil)
}

// Duration is a time.Duration that reads and writes JSON as "1.5s".
type Duration time.Duration

// MarshalJSON quotes the duration's String, which needs no escaping (digits,
// '.', '-' and unit letters), so no nested json.Marshal runs, twice, for
// every document written.
func (d Duration) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 16)
	b = append(b, '"')
	b = append(b, time.Duration(d).String()...)
	return append(b, '"'), nil
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration: %w", err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Task is the task document. JSON names are those of docs/tasks.md.
type Task struct {
	ID      string          `json:"_id,omitempty"`
	Key     string          `json:"key"`
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// Trace is the W3C trace context the task's attempts continue: its
	// publish's span (see PublishParams.Trace).
	Trace    Trace     `json:"trace,omitzero"`
	Priority int       `json:"priority"`
	RunAt    time.Time `json:"run_at"`
	// Seq orders tasks of equal priority by publish; the backend assigns it
	// and it grows with publish time.
	Seq                  int64    `json:"seq"`
	SpecificWorkerIDs    []string `json:"specific_worker_ids,omitempty"`
	ConcurrentWorkerCnt  int      `json:"concurrent_worker_cnt"`
	SuccessWorkerCnt     int      `json:"success_worker_cnt"`
	MaxUnexpectedRetries int      `json:"max_unexpected_retries"`
	PingInterval         Duration `json:"ping_interval"`
	WorkerTimeout        Duration `json:"worker_timeout"`
	LockKeys             []string `json:"lock_keys,omitempty"`
	// Group is the tenant (or any key) the task shares the workers as:
	// claims interleave groups by weight, and a group's concurrency
	// limit counts its running tasks (docs/tasks.md#groups).
	Group    string    `json:"group,omitempty"`
	Attempts []Attempt `json:"workers"`
	// AttemptsStarted is the highest attempt number ever handed out; it survives
	// entries being released or cleared so the fencing token only grows.
	AttemptsStarted int `json:"attempts"`
	// History holds the attempts that left Attempts (released, snoozed,
	// unpinned, and every entry a rerun cleared), oldest first, at most
	// MaxHistory; HistoryDropped counts the older ones left out.
	History        []Attempt `json:"history,omitempty"`
	HistoryDropped int       `json:"history_dropped,omitempty"`
	Cancelled      bool      `json:"cancelled,omitempty"`
	State          State     `json:"state"`
	NextClaimAt    time.Time `json:"next_claim_at"`
	Version        int64     `json:"version"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Changes are the lifecycle changes of the write that stored version
	// ChangesVersion (see WriteChanges).
	ChangesVersion int64    `json:"changes_version,omitempty"`
	Changes        []Change `json:"changes,omitempty"`
}

// Clone returns a deep copy, so a mutation never touches a shared document.
func (t *Task) Clone() *Task {
	c := *t
	c.Payload = slices.Clone(t.Payload)
	c.SpecificWorkerIDs = slices.Clone(t.SpecificWorkerIDs)
	c.LockKeys = slices.Clone(t.LockKeys)
	c.Attempts = cloneAttempts(t.Attempts)
	c.History = cloneAttempts(t.History)
	c.Changes = slices.Clone(t.Changes)
	return &c
}

func cloneAttempts(ws []Attempt) []Attempt {
	c := slices.Clone(ws)
	for i := range c {
		c[i].Result = slices.Clone(c[i].Result)
		c[i].Log = slices.Clone(c[i].Log)
		c[i].Slots = slices.Clone(c[i].Slots)
	}
	return c
}

// Defaults for task options. A dead worker's task is taken over after
// DefaultWorkerTimeout, so keep it at seconds.
const (
	DefaultPingInterval  = time.Second
	DefaultWorkerTimeout = 4 * time.Second
	// DefaultMaxUnexpectedRetries lets a task survive a few crashed workers.
	DefaultMaxUnexpectedRetries = 3
	// NoRetries in Options.MaxUnexpectedRetries fails a task at its first
	// failed or expired worker.
	NoRetries = -1
)

// Options are a task's tunable fields as a publisher gives them. Zero values
// take the documented defaults.
type Options struct {
	// Priority orders ready tasks, higher first. Default 0.
	Priority int
	// RunAt delays the task; zero means now.
	RunAt time.Time
	// SpecificWorkerIDs pins the task to these workers; empty means any.
	SpecificWorkerIDs []string
	// ConcurrentWorkerCnt is how many workers may run it at once. Default 1.
	ConcurrentWorkerCnt int
	// SuccessWorkerCnt is how many successes finish it. Default 1; at most
	// ConcurrentWorkerCnt is not required (successes may come one by one).
	SuccessWorkerCnt int
	// MaxUnexpectedRetries is how many failed or expired workers are
	// tolerated before the task fails. Zero means DefaultMaxUnexpectedRetries;
	// NoRetries means none.
	MaxUnexpectedRetries int
	// PingInterval is the lease renewal period. Default DefaultPingInterval,
	// or WorkerTimeout/4 (at most the default) when only that is set; at
	// least MinPingInterval.
	PingInterval time.Duration
	// WorkerTimeout is the lease length; must exceed PingInterval and be at
	// least MinWorkerTimeout. Default DefaultWorkerTimeout, or
	// 4×PingInterval (at least MinWorkerTimeout) when only that is set.
	WorkerTimeout time.Duration
	// LockKeys are resources held exclusively while the task runs.
	LockKeys []string
	// Group is the tenant the task runs as, for fair sharing and
	// concurrency limits; empty means none (a name like a key).
	Group string
}

// Trace is a W3C trace context as a task keeps it: the traceparent and
// tracestate of the span its attempts are children of.
type Trace struct {
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// IsZero reports whether t carries no context.
func (t Trace) IsZero() bool { return t.Traceparent == "" && t.Tracestate == "" }

// PublishParams is one publish call.
type PublishParams struct {
	Key     string
	Kind    string
	Payload json.RawMessage
	// Trace is the trace context the task continues. Empty: the span of
	// the publish's context, if it carries one. When tracing is on, the
	// publish's own span, a child of this context, is what is stored.
	Trace Trace
	Options
	// Rerun clears a finished task's workers so it runs again. A running
	// task is never reset.
	Rerun bool
	// Debounce, when set, makes the task wait this long after its latest
	// publish: a publish of the key while the task is pending and never
	// claimed replaces its payload and moves its run_at to now+Debounce
	// (Debounced) instead of leaving it alone; a claimed, running or
	// finished task is left as it is (Existing). At most MaxDebounce.
	Debounce time.Duration
}

// Validate checks p as given, defaults included, and changes nothing, so
// calling it again gives the same answer. Its errors wrap ErrInvalid and name
// the field.
func (p PublishParams) Validate() error { return p.validate(false) }

// validate is Validate; internal (see WithInternalWrite) accepts a key
// under ReservedPrefix and a payload nested up to MaxStoredDepth.
func (p PublishParams) validate(internal bool) error {
	if internal {
		if err := ValidateName("key", p.Key); err != nil {
			return err
		}
		if err := ValidateStoredPayload(p.Payload); err != nil {
			return err
		}
	} else {
		if err := ValidateKey("key", p.Key); err != nil {
			return err
		}
		if err := ValidatePayload(p.Payload); err != nil {
			return err
		}
	}
	if err := ValidateName("kind", p.Kind); err != nil {
		return err
	}
	if err := tracing.Check("trace.traceparent", "trace.tracestate", p.Trace.Traceparent, p.Trace.Tracestate); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for _, id := range p.SpecificWorkerIDs {
		if err := ValidateName("specific_worker_ids", id); err != nil {
			return err
		}
	}
	for _, k := range p.LockKeys {
		if err := ValidateLockKey("lock_keys", k); err != nil {
			return err
		}
	}
	if p.Group != "" {
		if err := ValidateName("group", p.Group); err != nil {
			return err
		}
	}
	if err := ValidateTime("run_at", p.RunAt); err != nil {
		return err
	}
	if err := validateDebounce(p.Debounce); err != nil {
		return err
	}
	switch {
	case p.ConcurrentWorkerCnt < 0:
		return invalid("concurrent_worker_cnt", "must be at least 1")
	case p.SuccessWorkerCnt < 0:
		return invalid("success_worker_cnt", "must be at least 1")
	case p.MaxUnexpectedRetries < NoRetries:
		return invalid("max_unexpected_retries", "must not be negative")
	case p.PingInterval < 0:
		return invalid("ping_interval", "must be positive")
	case p.WorkerTimeout < 0:
		return invalid("worker_timeout", "must be positive")
	}
	if p.PingInterval != 0 && p.PingInterval < MinPingInterval {
		return invalid("ping_interval", fmt.Sprintf("(%s) must be at least %s", p.PingInterval, MinPingInterval))
	}
	d := p.withDefaults()
	switch {
	case d.WorkerTimeout < MinWorkerTimeout:
		return invalid("worker_timeout", fmt.Sprintf("(%s) must be at least %s", d.WorkerTimeout, MinWorkerTimeout))
	case d.PingInterval < MinPingInterval:
		return invalid("ping_interval", fmt.Sprintf("(%s) must be at least %s", d.PingInterval, MinPingInterval))
	case d.WorkerTimeout <= d.PingInterval:
		return invalid("worker_timeout", fmt.Sprintf("(%s) must be above ping_interval (%s)", d.WorkerTimeout, d.PingInterval))
	}
	return nil
}

// withDefaults returns p with zero options set to their defaults, as the
// document stores them (NoRetries becomes 0). Apply it once, to params that
// Validate accepted: it is not idempotent.
func (p PublishParams) withDefaults() PublishParams {
	if len(p.Payload) == 0 {
		p.Payload = json.RawMessage("{}")
	}
	if p.ConcurrentWorkerCnt == 0 {
		p.ConcurrentWorkerCnt = 1
	}
	if p.SuccessWorkerCnt == 0 {
		p.SuccessWorkerCnt = 1
	}
	switch p.MaxUnexpectedRetries {
	case 0:
		p.MaxUnexpectedRetries = DefaultMaxUnexpectedRetries
	case NoRetries:
		p.MaxUnexpectedRetries = 0
	}
	switch {
	case p.PingInterval == 0 && p.WorkerTimeout == 0:
		p.PingInterval, p.WorkerTimeout = DefaultPingInterval, DefaultWorkerTimeout
	case p.PingInterval == 0:
		p.PingInterval = min(DefaultPingInterval, p.WorkerTimeout/4)
	case p.WorkerTimeout == 0:
		p.WorkerTimeout = max(4*p.PingInterval, MinWorkerTimeout)
	}
	if len(p.SpecificWorkerIDs) > 0 && len(p.SpecificWorkerIDs) < p.ConcurrentWorkerCnt {
		// Allowed, but a task can never have more distinct workers than pins.
		p.ConcurrentWorkerCnt = len(p.SpecificWorkerIDs)
	}
	return p
}

// NewTask validates p as Validate does and builds the document a publish
// inserts.
func NewTask(p PublishParams, now time.Time) (*Task, error) {
	return newTask(p, now, false)
}

// newTask is NewTask; internal validates as WithInternalWrite allows.
func newTask(p PublishParams, now time.Time, internal bool) (*Task, error) {
	if err := p.validate(internal); err != nil {
		return nil, err
	}
	p = p.withDefaults()
	runAt := p.RunAt
	if p.Debounce > 0 {
		runAt = clampTime(p.debounceRunAt(now))
	}
	if runAt.IsZero() || runAt.Before(now) {
		runAt = now
	}
	t := &Task{
		Key:                  p.Key,
		Kind:                 p.Kind,
		Payload:              p.Payload,
		Trace:                p.Trace,
		Priority:             p.Priority,
		RunAt:                runAt.UTC(),
		SpecificWorkerIDs:    p.SpecificWorkerIDs,
		ConcurrentWorkerCnt:  p.ConcurrentWorkerCnt,
		SuccessWorkerCnt:     p.SuccessWorkerCnt,
		MaxUnexpectedRetries: p.MaxUnexpectedRetries,
		PingInterval:         Duration(p.PingInterval),
		WorkerTimeout:        Duration(p.WorkerTimeout),
		LockKeys:             p.LockKeys,
		Group:                p.Group,
		Attempts:             []Attempt{},
		Version:              1,
		CreatedAt:            now.UTC(),
		UpdatedAt:            now.UTC(),
	}
	t.Recompute(now)
	return t, nil
}
