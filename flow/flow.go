// Package flow runs multi-step jobs with rollback on top of the task queue.
//
// A flow is a stored document (past 100 steps, a document and the parts
// it names: split.go): its steps (a task kind and payload with its
// own timeout and retries and an optional rollback, or a wait for a signal,
// or a timer), the steps each needs (a DAG; none named: each step needs the
// one before), the shared parameters (the request's, plus each finished
// step's result under the step's name), each step's record and a state.
// Each task step runs as an ordinary leasepool task with a deterministic
// key (see StepKey), so claims, leases, pings, preemption and fencing are
// the queue's; steps ready together run in parallel. The flow moves only by
// compare-and-set on its document, and the tasks a write started are
// published right after it, idempotently by key: whoever next looks at the
// flow after a crash in between (the step worker's Middleware, or
// Reconcile, which a Reconciler runs under a lease in the lock table)
// publishes the same keys again, and nothing runs twice.
//
// If a step fails after its retries, no step starts any more and every
// started step is rolled back once the steps that need it are (engine.go
// states the rule), unless a fan-in step with MaxFailedNeeds counts the
// failure and tolerates it (tolerate.go); each rollback runs with its own
// timeout and retries; a rollback that fails leaves the flow
// rollback_failed with an alert event on the document and an error in the
// log. Signal (and the API and CLI
// over it) ends a signal step's wait.
//
// Workers that run step tasks must use Middleware (Register): step tasks
// carry an envelope payload that it unwraps, and it records each step's
// outcome and fires timers.
package flow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasepool/leasepool/internal/jsoncheck"
	"github.com/leasepool/leasepool/task"
)

// State is a flow's state.
type State string

const (
	StatePending        State = "pending"         // stored, first step not yet published
	StateRunning        State = "running"         // a step's task is running or due
	StateRollingBack    State = "rolling_back"    // a step failed (or a cancel asked for it): undoing
	StateSucceeded      State = "succeeded"       // every step succeeded
	StateFailed         State = "failed"          // a step failed and every rollback ran
	StateRollbackFailed State = "rollback_failed" // a rollback failed after its retries: needs a human
	StateCancelled      State = "cancelled"       // cancelled without rollback
)

// Finished reports whether the flow has stopped moving on its own.
func (s State) Finished() bool {
	switch s {
	case StateSucceeded, StateFailed, StateRollbackFailed, StateCancelled:
		return true
	}
	return false
}

// Sentinel errors callers branch on.
var (
	ErrNotFound = errors.New("flow not found")
	// ErrFinished: the flow has stopped (cancel of a finished flow).
	ErrFinished = errors.New("flow finished")
	// ErrNotFinished: retry of a flow still moving.
	ErrNotFinished = errors.New("flow not finished")
)

// Action is one task to run: a step's forward work or its rollback.
type Action struct {
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// Timeout bounds each attempt of the handler; zero: no bound but the
	// lease.
	Timeout task.Duration `json:"timeout,omitempty"`
	// Retries is how many failed attempts are tolerated before the action
	// fails; nil takes the task default (3), 0 none.
	Retries *int `json:"retries,omitempty"`
	// LockKeys are held exclusively while the action's task runs, as a
	// task's lock_keys. A device command step must name its device's lock
	// (device:<id>): mqttdev.PublishParams adds it for plain tasks, but the
	// flow engine does not know the device kind.
	LockKeys []string `json:"lock_keys,omitempty"`
	// Priority orders the action's task among ready tasks.
	Priority int `json:"priority,omitempty"`
}

// Step is one step of a flow.
type Step struct {
	Name string `json:"name"`
	// Type is what the step does (see StepType): empty is TypeTask, or
	// TypeSleep when Sleep or Until is set.
	Type StepType `json:"type,omitempty"`
	// Needs names the steps that must succeed before this one starts.
	// In a flow where no step names any, each step needs the one before.
	Needs []string `json:"needs,omitempty"`
	// MaxFailedNeeds, when positive, lets the step start once every step
	// it needs has ended, succeeded or failed after its retries, provided
	// at most this many failed (a fan-in over a fleet: "go on unless more
	// than 2 of the 5 updates failed"). A failed step counted by such a
	// step stops nothing and is not rolled back; more than MaxFailedNeeds
	// failures fail the flow. Zero: every need must succeed.
	MaxFailedNeeds int `json:"max_failed_needs,omitempty"`
	// Action is a task step's work. A signal step uses only its Timeout:
	// how long it waits for its signal (zero: for ever).
	Action
	// Default is what a signal step takes as its payload when its
	// timeout passes; without one the timeout fails the step.
	Default json.RawMessage `json:"default,omitempty"`
	// Sleep (a duration) or Until (an RFC 3339 time) is when a sleep
	// step ends: Sleep counts from the step's start.
	Sleep task.Duration `json:"sleep,omitempty"`
	Until time.Time     `json:"until,omitzero"`
	// Rollback undoes the step; nil means there is nothing to undo.
	Rollback *Action `json:"rollback,omitempty"`
}

// Spec is what a caller publishes.
type Spec struct {
	Key string `json:"key"`
	// Params are the request's parameters: a JSON object.
	Params json.RawMessage `json:"params,omitempty"`
	Steps  []Step          `json:"steps"`
}

// Limits.
const (
	// MaxSteps bounds a flow's steps. A flow of more than 100 is stored
	// in parts (split.go): no step count fits one document.
	MaxSteps = 10000
	// MaxKeyLen leaves room in a step's task key for the step part.
	MaxKeyLen = 256
	// MaxNameLen bounds a step name.
	MaxNameLen = 64
)

// Validate checks s and changes nothing. Its errors wrap task.ErrInvalid
// and name the field (steps[1].rollback.kind).
func (s Spec) Validate() error {
	// The key starts every step task's key (StepKey), so refusing
	// task.ReservedPrefix here keeps steps out of it too.
	if err := task.ValidateKey("key", s.Key); err != nil {
		return err
	}
	if len(s.Key) > MaxKeyLen {
		return invalid("key", fmt.Sprintf("is longer than %d bytes", MaxKeyLen))
	}
	if len(s.Params) > 0 {
		if len(s.Params) > MaxParamsSize {
			return invalid("params", fmt.Sprintf("larger than %d bytes", MaxParamsSize))
		}
		if err := task.ValidateJSON("params", s.Params, task.MaxJSONDepth); err != nil {
			return err
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(s.Params, &m); err != nil || m == nil {
			return invalid("params", "must be a JSON object")
		}
	}
	if len(s.Steps) == 0 {
		return invalid("steps", "must name at least one step")
	}
	if len(s.Steps) > MaxSteps {
		return invalid("steps", fmt.Sprintf("more than %d", MaxSteps))
	}
	seen := map[string]bool{}
	for i, st := range s.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		if err := task.ValidateName(field+".name", st.Name); err != nil {
			return err
		}
		if len(st.Name) > MaxNameLen {
			return invalid(field+".name", fmt.Sprintf("is longer than %d bytes", MaxNameLen))
		}
		if k := StepKey(s.Key, 1, i, st.Name, false); !task.PathNameable(k) {
			return invalid(field+".name", fmt.Sprintf("%q makes the step's task key %q, which cannot be named in a URL path", st.Name, k))
		}
		if seen[st.Name] {
			return invalid(field+".name", fmt.Sprintf("%q names two steps", st.Name))
		}
		seen[st.Name] = true
		if err := st.validate(field); err != nil {
			return err
		}
	}
	return validateNeeds(s.Steps)
}

func (a Action) validate(field string) error {
	if err := task.ValidateName(field+".kind", a.Kind); err != nil {
		return err
	}
	if len(a.Payload) > task.MaxPayloadSize {
		return invalid(field+".payload", fmt.Sprintf("is %d bytes, more than the limit of %d", len(a.Payload), task.MaxPayloadSize))
	}
	if err := task.ValidateJSON(field+".payload", a.Payload, task.MaxJSONDepth); err != nil {
		return err
	}
	if a.Timeout < 0 {
		return invalid(field+".timeout", "must not be negative")
	}
	if a.Retries != nil && *a.Retries < 0 {
		return invalid(field+".retries", "must not be negative")
	}
	for _, k := range a.LockKeys {
		if err := task.ValidateLockKey(field+".lock_keys", k); err != nil {
			return err
		}
	}
	return nil
}

func invalid(field, msg string) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, msg)
}

// RunState is where one action of one step stands in the current run.
type RunState string

const (
	RunNone      RunState = ""          // not started
	RunActive    RunState = "active"    // its task is published (or about to be)
	RunSucceeded RunState = "succeeded" // done
	RunFailed    RunState = "failed"    // failed after its retries
	RunCancelled RunState = "cancelled" // stopped by a flow cancel
)

// Run is the record of one action (do or undo) of one step.
type Run struct {
	State RunState `json:"state,omitempty"`
	// Task is the task key: a task step's work or rollback, or the timer
	// of a sleep step or of a signal step with a timeout.
	Task      string    `json:"task,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Due is when a sleep step's timer fires, or a signal step's wait
	// times out.
	Due time.Time `json:"due,omitzero"`
	// Failures counts failed attempts; Error is the latest one's.
	Failures int    `json:"failures,omitempty"`
	Error    string `json:"error,omitempty"`
	// Attempt is the task attempt whose outcome was recorded; Attempts the
	// highest attempt number seen (a SIGKILLed attempt counts).
	Attempt  int `json:"attempt,omitempty"`
	Attempts int `json:"attempts,omitempty"`
}

// Progress is a step's do and undo in the current run.
type Progress struct {
	// State sums the step up (see StepState); kept with every write.
	State StepState `json:"state,omitempty"`
	// Reason says why a skipped step never started ("needs b, which
	// failed"); kept with State.
	Reason string `json:"reason,omitempty"`
	Do     Run    `json:"do"`
	Undo   Run    `json:"undo"`
	// Order is the step's place among the run's steps whose work ended
	// (1 the first); rollbacks follow it backwards.
	Order int `json:"order,omitempty"`
	// Signal is a signal step's signal, kept from its arrival (which may
	// come before the step starts) until the step takes it.
	Signal *Received `json:"signal,omitempty"`
}

// Received is the signal a signal step was sent.
type Received struct {
	At      time.Time       `json:"at"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Event is something the flow's watchers should know: a rollback that
// failed (an alert), a cancel, a retry.
type Event struct {
	At      time.Time `json:"at"`
	Type    string    `json:"type"`
	Step    string    `json:"step,omitempty"`
	Message string    `json:"message,omitempty"`
	Gen     int       `json:"gen"`
}

// Event types.
const (
	EventRollbackFailed = "rollback_failed" // an alert: the flow needs a human
	EventStepFailed     = "step_failed"
	EventCancelled      = "cancelled"
	EventRetried        = "retried"
	EventSucceeded      = "succeeded"
	EventRolledBack     = "rolled_back"
)

// Flow is the stored document.
type Flow struct {
	Key    string                     `json:"key"`
	Steps  []Step                     `json:"steps"`
	Params map[string]json.RawMessage `json:"params"`
	State  State                      `json:"state"`
	// Cursor is the index of the step started last (its work, or its
	// rollback while rolling back): in a flow without parallel steps the
	// step being done or undone, or where the flow stopped.
	Cursor int `json:"cursor"`
	// Gen is the run generation: 1, plus one per retry. It is part of the
	// step tasks' keys, so a retried step runs as a new task.
	Gen      int        `json:"gen"`
	Progress []Progress `json:"progress"`
	Events   []Event    `json:"events,omitempty"`
	// Trace is the W3C trace context of the flow's publish (its span when
	// tracing is on): its steps', timers' and signals' spans are its
	// children.
	Trace task.Trace `json:"trace,omitzero"`
	// Error is why the flow failed or rolls back: the first step failure.
	Error     string    `json:"error,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Version is the stored document's version (not stored in the flow).
	Version int64 `json:"-"`

	// What the transition just applied asks of its caller once the write
	// is stored: the runs it started, whose tasks to publish, and the
	// tasks to cancel.
	started []runRef
	stops   []string

	g     *graph // the DAG's indexes (graph.go)
	split *split // where a split flow's parts are; nil: one document
	// shared: partCache's copy, never changed (clone to change it).
	shared bool
	// base is paramsFor's parameters of no succeeded step, computed once.
	base map[string]json.RawMessage
	// allDirty: every state part is to be written (retry deletes results
	// without changing every record).
	allDirty bool
}

// MaxEvents bounds the events kept on a document (the oldest go first).
const MaxEvents = 50

// StepKey is the deterministic task key of step i (0-based) of flow key in
// run generation gen, forward (undo false) or rollback: KEY/N/NAME/do or
// /undo with N 1-based, and #GEN appended from the second run on.
func StepKey(key string, gen, i int, name string, undo bool) string {
	dir := "do"
	if undo {
		dir = "undo"
	}
	k := fmt.Sprintf("%s/%d/%s/%s", key, i+1, name, dir)
	if gen > 1 {
		k += fmt.Sprintf("#%d", gen)
	}
	return k
}

func (f *Flow) addEvent(e Event) {
	e.Gen = f.Gen
	f.Events = append(f.Events, e)
	if n := len(f.Events) - MaxEvents; n > 0 {
		f.Events = append([]Event(nil), f.Events[n:]...)
	}
}

// ParseSpec reads a flow's JSON (see the README's "Flows" section) strictly:
// an unknown field, a value of the wrong type or trailing data is refused
// with an error that names the field and wraps task.ErrInvalid. It does not
// validate: a file may leave the key to the caller; call Spec.Validate.
func ParseSpec(r io.Reader) (Spec, error) {
	var s Spec
	b, err := io.ReadAll(r)
	if err != nil {
		return s, fmt.Errorf("%w: flow JSON: %w", task.ErrInvalid, err)
	}
	// encoding/json would rewrite invalid UTF-8 to U+FFFD and recurse
	// 10,000 levels deep: both are refused first, naming the field.
	if err := jsoncheck.Body(b); err != nil {
		return s, err
	}
	raw := bytes.NewBuffer(b)
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return s, invalid(strings.ReplaceAll(te.Field, ".Action", ""), fmt.Sprintf("want a JSON %s, got %s", te.Type, te.Value))
		}
		return s, fmt.Errorf("%w: %sflow JSON: %v", task.ErrInvalid, badDuration(raw.Bytes()), err)
	}
	if d.More() {
		return s, fmt.Errorf("%w: flow JSON: more than one value", task.ErrInvalid)
	}
	return s, nil
}

// badDuration names the duration or time field an error came from
// ("steps[1].rollback.timeout: "), which encoding/json does not say.
func badDuration(b []byte) string {
	var doc struct {
		Steps []struct {
			Timeout  json.RawMessage `json:"timeout"`
			Sleep    json.RawMessage `json:"sleep"`
			Until    json.RawMessage `json:"until"`
			Rollback *struct {
				Timeout json.RawMessage `json:"timeout"`
			} `json:"rollback"`
		} `json:"steps"`
	}
	if json.Unmarshal(b, &doc) != nil {
		return ""
	}
	bad := func(raw json.RawMessage) bool {
		var d task.Duration
		return len(raw) > 0 && json.Unmarshal(raw, &d) != nil
	}
	for i, st := range doc.Steps {
		if bad(st.Timeout) {
			return fmt.Sprintf("steps[%d].timeout: ", i)
		}
		if bad(st.Sleep) {
			return fmt.Sprintf("steps[%d].sleep: ", i)
		}
		var at time.Time
		if len(st.Until) > 0 && json.Unmarshal(st.Until, &at) != nil {
			return fmt.Sprintf("steps[%d].until: ", i)
		}
		if st.Rollback != nil && bad(st.Rollback.Timeout) {
			return fmt.Sprintf("steps[%d].rollback.timeout: ", i)
		}
	}
	return ""
}
