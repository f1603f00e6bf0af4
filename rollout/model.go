// Package rollout sends one device command to a fleet, safely: in waves
// (cumulative targets such as 1, 5%, 25%, 100%), at a bounded rate, with
// abort rules over the failures counted so far, per-device timeouts and
// retries, operator gates between waves, and a rollback command run on the
// devices that succeeded when a rollout aborts.
//
// A rollout is a task.Document (namespace Namespace, id its name) written
// only by compare-and-set. Operators' writes (Create, Pause, Resume,
// Cancel, RetryFailed, Approve) change its state; a Driver, run by every
// worker under a singleton lease (internal/singleton), advances it: it
// records which devices it dispatches in the document first, under a
// compare-and-set that checks the rollout is running, and only then
// publishes each device's command as a device task (mqttdev) whose key
// is the rollout's name, the device and the attempt (TaskKey). A driver
// that dies between the two is replaced by one that publishes the same
// keys again, which inserts nothing twice; a rollout aborted or cancelled
// after the record is seen before the publish (the driver publishes only
// what a running rollout's document holds, reading it again first), and
// its queued tasks are cancelled before the abort is recorded.
//
// The read model (Get, List, and Rollout.Progress) is what the CLI, the
// HTTP API and the dashboard show.
package rollout

import (
	"encoding/json"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Namespace is the task.Document namespace of rollouts; a rollout's
// document id is its name.
const Namespace = "leasepool.rollout"

// State is a rollout's state.
type State string

// The states of a rollout. Running, Paused and Waiting are active;
// Aborting and Cancelling are the driver's steps to Aborted and Cancelled
// (queued commands are withdrawn, running ones end); Completed, Aborted
// and Cancelled are final (an aborted rollout's rollback may still run).
const (
	StateRunning    State = "running"
	StatePaused     State = "paused"  // an operator paused it: nothing new is dispatched
	StateWaiting    State = "waiting" // a wave gate waits for an operator's approval
	StateAborting   State = "aborting"
	StateAborted    State = "aborted"
	StateCancelling State = "cancelling"
	StateCancelled  State = "cancelled"
	StateCompleted  State = "completed"
)

// Final reports whether nothing more is dispatched under s.
func (s State) Final() bool {
	return s == StateAborted || s == StateCancelled || s == StateCompleted
}

// Outcome is how one device's execution ended, or where it stands.
type Outcome string

// The outcomes of a device execution. Refused, Failed, TimedOut and
// Offline are the failure kinds abort rules and retries count.
const (
	OutcomeQueued    Outcome = "queued"    // in a started wave, not dispatched yet (stored as "" until first dispatched)
	OutcomeRunning   Outcome = "running"   // its device task is published
	OutcomeSucceeded Outcome = "succeeded" // the device reported success
	OutcomeFailed    Outcome = "failed"    // the device reported failure (or the task failed otherwise)
	OutcomeRefused   Outcome = "refused"   // the device refused the command
	OutcomeTimedOut  Outcome = "timed_out" // no ack, or no result in time
	OutcomeOffline   Outcome = "offline"   // the device stayed offline past the limit
	OutcomeCancelled Outcome = "cancelled" // withdrawn by an abort or a cancel
	OutcomeSkipped   Outcome = "skipped"   // in a wave the rollout never started
)

// Outcomes are every outcome, in the order of a rollout's life.
var Outcomes = []Outcome{OutcomeQueued, OutcomeRunning, OutcomeSucceeded, OutcomeFailed, OutcomeRefused,
	OutcomeTimedOut, OutcomeOffline, OutcomeCancelled, OutcomeSkipped}

// ParseOutcome reads an outcome's name (field names it in the error).
func ParseOutcome(field, s string) (Outcome, error) {
	for _, o := range Outcomes {
		if string(o) == s {
			return o, nil
		}
	}
	return "", invalid(field, "%q is not an outcome (queued, running, succeeded, failed, refused, timed_out, offline, cancelled, skipped)", s)
}

// FailureKinds are the outcomes abort rules and retries count.
var FailureKinds = []Outcome{OutcomeFailed, OutcomeRefused, OutcomeTimedOut, OutcomeOffline}

// Failure reports whether o is one of FailureKinds.
func (o Outcome) Failure() bool {
	return o == OutcomeFailed || o == OutcomeRefused || o == OutcomeTimedOut || o == OutcomeOffline
}

// Done reports whether the execution has ended (no further attempt is
// scheduled at this moment).
func (o Outcome) Done() bool {
	return o != OutcomeQueued && o != OutcomeRunning && o != ""
}

// Spec is what an operator asks for; it does not change after Create
// (but for the approvals and retries operators give).
type Spec struct {
	// Command and Args are sent to every device (mqttdev.Command).
	Command string          `json:"command"`
	Args    json.RawMessage `json:"args,omitempty"`
	// Select picks devices by inventory labels at create time; Devices
	// names them instead. Exactly one is given.
	Select  string   `json:"select,omitempty"`
	Devices []string `json:"devices,omitempty"`
	// Waves are cumulative targets ("1", "5%", "25%", "100%"); the last
	// must cover every device. Empty means one wave of every device.
	Waves []WaveTarget `json:"waves"`
	// ApproveWaves makes every wave after the first wait for an
	// operator's approval (Approve).
	ApproveWaves bool `json:"approve_waves,omitempty"`
	// GateFailures is the failure percentage of a wave (every failure
	// kind counted) at or above which the next wave waits for approval;
	// zero means the tightest abort rule's percentage, counting that
	// rule's kinds, or no gate without rules.
	GateFailures float64 `json:"gate_failures,omitempty"`
	// Rate bounds dispatches: at most N devices sent the command in any
	// window of Per. Zero N: no bound.
	Rate Rate `json:"rate,omitzero"`
	// AbortWhen are the abort rules, any of which aborts.
	AbortWhen []AbortRule `json:"abort_when,omitempty"`
	// Timeout is each device's result timeout (mqttdev.Command's);
	// OfflineLimit how long a command waits for an offline device before
	// it counts as offline. Zero means mqttdev's defaults, and
	// DefaultOfflineLimit.
	Timeout      task.Duration `json:"timeout,omitempty"`
	OfflineLimit task.Duration `json:"offline_limit,omitempty"`
	// Retries is how many more attempts a device gets after a failure of
	// a kind in RetryOn (default every failure kind).
	Retries int       `json:"retries,omitempty"`
	RetryOn []Outcome `json:"retry_on,omitempty"`
	// RollbackCommand, when set, runs with RollbackArgs on every device
	// that succeeded, when the rollout aborts.
	RollbackCommand string          `json:"rollback_command,omitempty"`
	RollbackArgs    json.RawMessage `json:"rollback_args,omitempty"`
	// Priority of the device tasks.
	Priority int `json:"priority,omitempty"`
}

// WaveTarget is one cumulative wave target: Count devices, or Percent of
// the rollout's devices (rounded up).
type WaveTarget struct {
	Count   int     `json:"count,omitempty"`
	Percent float64 `json:"percent,omitempty"`
}

// Rate is N dispatches per Per.
type Rate struct {
	N   int           `json:"n"`
	Per task.Duration `json:"per"`
}

// AbortRule aborts the rollout when, after at least After executions
// ended, the executions that ended in one of Kinds are more than Percent
// of those that ended.
type AbortRule struct {
	Kinds   []Outcome `json:"kinds"`
	Percent float64   `json:"percent"`
	After   int       `json:"after"`
}

// Rollout is a rollout as stored: its spec, its state and every device's
// execution.
type Rollout struct {
	Name  string `json:"name"`
	Spec  Spec   `json:"spec"`
	State State  `json:"state"`
	// Reason says why it aborted, was cancelled, paused or waits.
	Reason string `json:"reason,omitempty"`
	// Wave is the index of the wave being run (or the last one run).
	Wave  int    `json:"wave"`
	Waves []Wave `json:"waves"`
	// Devices are the executions, in wave then id order (which is id
	// order). They are stored outside the rollout's document, ShardSize
	// to a shard document (shards.go); Get loads them, GetHead does not.
	Devices []Exec `json:"-"`
	// DeviceCount is len(Devices), kept in the document for readers of
	// the aggregates alone.
	DeviceCount int `json:"device_count"`
	// ShardKey names the rollout's shard documents (ShardNamespace, id
	// ShardKey/N): unique to this creation, so a deleted rollout's
	// shards never stand for a new one's of the same name.
	ShardKey string `json:"shard_key,omitempty"`
	// Shards are the versions of the shard documents whose executions the
	// aggregates (Waves[i].Counts, RolledBack) were counted from.
	Shards []int64 `json:"shards,omitempty"`
	// RolledBack counts the rollback's outcomes.
	RolledBack Counts `json:"rolled_back,omitzero"`
	// sums are fingerprints of the shards' executions as stored (version
	// Shards[i]): a write stores only the shards whose executions no
	// longer match them.
	sums []uint64
	// stale: a shard was read at a later version than the aggregates
	// were counted from; the next write counts them again.
	stale   bool
	staleAt time.Time // the latest store write of such a shard
	// Dispatches are the store times of the last Rate.N dispatches, the
	// rate's window: a dispatch is recorded before its task is published.
	Dispatches []time.Time `json:"dispatches,omitempty"`
	// Rollback is the rollback's progress once an abort started one.
	Rollback *Rollback `json:"rollback,omitempty"`
	// Events are the rollout's lifecycle events, oldest first, the last
	// MaxEvents; EventSeq counts every event ever added.
	Events   []Event `json:"events,omitempty"`
	EventSeq int64   `json:"event_seq"`
	// Trace is the W3C trace context of the rollout's creation (its span
	// when tracing is on): its device tasks are published as its children.
	Trace task.Trace `json:"trace,omitzero"`

	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// EndedAt is when the rollout reached a final state: for an abort,
	// when the abort was recorded (no command is dispatched, and no
	// queued one can start, after it).
	EndedAt time.Time `json:"ended_at,omitzero"`

	// Version is the document's version (compare-and-set).
	Version int64 `json:"version"`
}

// Wave is one wave: devices Devices[Start:End].
type Wave struct {
	Target WaveTarget `json:"target"`
	Start  int        `json:"start"`
	End    int        `json:"end"`
	// Gate is how the wave may start: GateAuto, GateApproval.
	Gate Gate `json:"gate"`
	// Approved is set by an operator's Approve of a wave that waits.
	Approved  bool      `json:"approved,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Stopped says the rollout's abort or cancel ended the wave while it
	// ran (EndedAt is then the rollout's ended_at): its queued commands
	// were withdrawn.
	Stopped bool `json:"stopped,omitempty"`
	// Counts are the wave's executions by outcome, counted from the
	// shards at every write of the rollout.
	Counts Counts `json:"counts"`
}

// Gate is what a wave waits for before it starts.
type Gate string

// Gates.
const (
	GateAuto     Gate = "auto"     // the previous wave's failures under the threshold
	GateApproval Gate = "approval" // an operator's approval (ApproveWaves)
)

// Exec is one device's execution.
type Exec struct {
	Device  string  `json:"device"`
	Wave    int     `json:"wave"`
	Outcome Outcome `json:"outcome"`
	// Attempt counts dispatches: the key of the current one is
	// TaskKey(name, Device, Attempt).
	Attempt int `json:"attempt,omitempty"`
	// Lost counts attempts whose worker died (a lease expired): sent
	// again without spending a retry.
	Lost         int       `json:"lost,omitempty"`
	DispatchedAt time.Time `json:"dispatched_at,omitzero"`
	// Published is set once the current attempt's task is known stored.
	Published bool `json:"published,omitempty"`
	// Dispatched are the store times of the last MaxDispatched
	// dispatches of this device, one per attempt, each recorded before
	// its task was published.
	Dispatched []time.Time `json:"dispatched,omitempty"`
	EndedAt    time.Time   `json:"ended_at,omitzero"`
	// Error says why the execution failed, at most MaxErrorLen bytes.
	Error string `json:"error,omitempty"`
	// Rollback is the outcome of the device's rollback command, if run.
	Rollback Outcome `json:"rollback,omitempty"`
}

// Rollback is the progress of the rollback command.
type Rollback struct {
	Command   string    `json:"command"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
}

// Event is one lifecycle event of a rollout.
type Event struct {
	Seq    int64     `json:"seq"`
	Type   string    `json:"type"`
	At     time.Time `json:"at"`
	Wave   int       `json:"wave"`
	Detail string    `json:"detail,omitempty"`
	// Version is the version of the rollout's document whose write added
	// the event: the event stream derives each write's events from the
	// document it stored alone.
	Version int64 `json:"version,omitempty"`
}

// Event types.
const (
	EventCreated         = "rollout.created"
	EventWaveStarted     = "rollout.wave_started"
	EventWaveEnded       = "rollout.wave_ended"
	EventWaiting         = "rollout.waiting"
	EventApproved        = "rollout.approved"
	EventPaused          = "rollout.paused"
	EventResumed         = "rollout.resumed"
	EventAborted         = "rollout.aborted"
	EventCancelled       = "rollout.cancelled"
	EventCompleted       = "rollout.completed"
	EventRetrying        = "rollout.retrying"
	EventRollbackStarted = "rollout.rollback_started"
	EventRollbackEnded   = "rollout.rollback_ended"
)

// Bounds.
const (
	MaxNameLen = 64
	// MaxDevices bounds a rollout. Its executions live in shard
	// documents of ShardSize each; its own document holds aggregates.
	MaxDevices = 100_000
	// MaxRate bounds Rate.N: the rate's window of dispatch times lives in
	// the rollout's document.
	MaxRate = 1000
	// MaxSpecDevices is how many devices named in Spec.Devices the
	// rollout's document keeps in its spec; a longer list is in the
	// executions alone.
	MaxSpecDevices = 1000
	MaxWaves       = 32
	MaxRetries     = 10
	MaxEvents      = 100
	// DefaultOfflineLimit is Spec.OfflineLimit's default.
	DefaultOfflineLimit = 10 * time.Minute
)

// Counts are executions by outcome.
type Counts struct {
	Total     int `json:"total"`
	Queued    int `json:"queued"`
	Running   int `json:"running"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Refused   int `json:"refused"`
	TimedOut  int `json:"timed_out"`
	Offline   int `json:"offline"`
	Cancelled int `json:"cancelled"`
	Skipped   int `json:"skipped"`
}

// Failures is the sum of the failure kinds.
func (c Counts) Failures() int { return c.Failed + c.Refused + c.TimedOut + c.Offline }

// Ended is how many executions ended with success or a failure.
func (c Counts) Ended() int { return c.Succeeded + c.Failures() }

func (c *Counts) add(o Outcome) {
	c.Total++
	switch o {
	case OutcomeQueued, "":
		c.Queued++
	case OutcomeRunning:
		c.Running++
	case OutcomeSucceeded:
		c.Succeeded++
	case OutcomeFailed:
		c.Failed++
	case OutcomeRefused:
		c.Refused++
	case OutcomeTimedOut:
		c.TimedOut++
	case OutcomeOffline:
		c.Offline++
	case OutcomeCancelled:
		c.Cancelled++
	case OutcomeSkipped:
		c.Skipped++
	}
}

// Of returns the count of outcome o.
func (c Counts) Of(o Outcome) int {
	switch o {
	case OutcomeQueued:
		return c.Queued
	case OutcomeRunning:
		return c.Running
	case OutcomeSucceeded:
		return c.Succeeded
	case OutcomeFailed:
		return c.Failed
	case OutcomeRefused:
		return c.Refused
	case OutcomeTimedOut:
		return c.TimedOut
	case OutcomeOffline:
		return c.Offline
	case OutcomeCancelled:
		return c.Cancelled
	case OutcomeSkipped:
		return c.Skipped
	}
	return 0
}

// Progress is the read model of a rollout for the CLI, the API and the
// dashboard: each wave's counts, the totals, the thresholds and the gate
// of the next wave.
type Progress struct {
	Name   string         `json:"name"`
	State  State          `json:"state"`
	Reason string         `json:"reason,omitempty"`
	Spec   Spec           `json:"spec"`
	Wave   int            `json:"wave"`
	Waves  []WaveProgress `json:"waves"`
	Total  Counts         `json:"total"`
	// GateFailures is the wave failure percentage at or above which the
	// next wave waits for approval (0: no gate).
	GateFailures float64 `json:"gate_failures"`
	// AbortAt is the rollout's failure percentage the tightest abort rule
	// aborts above (0: no rule), after AbortAfter ended executions.
	AbortAt    float64 `json:"abort_at"`
	AbortAfter int     `json:"abort_after"`
	// FailureRate is the percentage of ended executions that failed.
	FailureRate float64 `json:"failure_rate"`
	// Next is the gate of the next wave, if one is left.
	Next     *GateState `json:"next,omitempty"`
	Rollback *Rollback  `json:"rollback,omitempty"`
	// RolledBack counts the rollback's outcomes, once one started.
	RolledBack Counts    `json:"rolled_back"`
	Events     []Event   `json:"events,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	EndedAt    time.Time `json:"ended_at,omitzero"`
	Version    int64     `json:"version"`
}

// WaveState is where a wave stands, in Progress.
type WaveState string

// The states of a wave.
const (
	WavePending   WaveState = "pending"   // not started yet
	WaveRunning   WaveState = "running"   // started; some of its executions have not ended
	WaveEnded     WaveState = "ended"     // every execution of it ended
	WaveAborted   WaveState = "aborted"   // running when the rollout aborted: ended then, its queued commands withdrawn
	WaveCancelled WaveState = "cancelled" // running when the rollout was cancelled: ended then, likewise
	WaveSkipped   WaveState = "skipped"   // never started: the rollout aborted or was cancelled first
)

// WaveProgress is one wave of Progress.
type WaveProgress struct {
	Index int `json:"index"`
	// State is where the wave stands (see WaveState).
	State WaveState `json:"state"`
	// Target is the cumulative number of devices once the wave ended;
	// Size the devices in this wave alone.
	Target    int        `json:"target"`
	Size      int        `json:"size"`
	Spec      WaveTarget `json:"spec"`
	Counts    Counts     `json:"counts"`
	Started   bool       `json:"started"`
	Ended     bool       `json:"ended"`
	Gate      Gate       `json:"gate"`
	StartedAt time.Time  `json:"started_at,omitzero"`
	EndedAt   time.Time  `json:"ended_at,omitzero"`
	// FailureRate is the percentage of this wave's ended executions that
	// failed.
	FailureRate float64 `json:"failure_rate"`
}

// GateState is where the next wave's gate stands.
type GateState struct {
	Wave int  `json:"wave"`
	Gate Gate `json:"gate"`
	// State: "closed" (the current wave has not ended), "waiting" (for an
	// operator's approval), "open" (it starts at the driver's next step).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// TaskKey is the key of the device task of device's attempt of rollout
// name: "rollout:NAME:DEVICE:ATTEMPT". Names and attempts hold no ':', so
// the key names one execution.
func TaskKey(name, device string, attempt int) string {
	return "rollout:" + name + ":" + device + ":" + itoa(attempt)
}

// RollbackKey is the key of device's rollback task of rollout name.
func RollbackKey(name, device string) string {
	return "rollout:" + name + ":" + device + ":rollback"
}
