// Package events turns a store's change stream into task lifecycle events
// (published, claimed, expired or taken over, succeeded, failed, retried,
// released, snoozed, unpinned, cancelled, reset) and the events fleet
// rollouts record (rollout.created, rollout.wave_started, ...), resumable
// from a token exactly: no event missed, none repeated. It imports only
// task.
//
// The events of one write are derived from the document after that write
// alone: each mutation notes what it did in the document under the version
// it writes (task.Task.WriteChanges), and version 1 is the publish. No
// per-key cache is kept, so a resumed stream derives the same events as an
// uninterrupted one. A rollout's document marks each event it keeps with
// the version of the write that added it (DeriveRollout).
package events

import (
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Event types. Each is one field value of Event.Type.
const (
	Published = "published" // version 1 of a task
	Claimed   = "claimed"   // Worker took Attempt
	Expired   = "expired"   // Worker's lease of Attempt ran out; By names the claimer that took over, if any
	Succeeded = "succeeded"
	Failed    = "failed"  // Error
	Retried   = "retried" // after a failure that leaves the task runnable: Until is its next claim time
	Released  = "released"
	Snoozed   = "snoozed"  // Until
	Unpinned  = "unpinned" // the lease was lost: the worker is no longer among the pins
	Cancelled = "cancelled"
	Reset     = "reset" // publish with rerun, or retry: runs again from Until
	// Logged is one line the attempt's handler logged (Job.Log), in
	// Message, at At (the handler's time); device commands log sent,
	// acked and result. Lines reach the store with the attempt's next
	// renewal or its outcome, so they come up to a ping interval late.
	Logged = "logged"
)

// TaskTypes lists the task event types, in lifecycle order.
var TaskTypes = []string{Published, Claimed, Expired, Succeeded, Failed, Retried, Released, Snoozed, Unpinned, Cancelled, Reset, Logged}

// Types lists every event type: TaskTypes, then RolloutTypes.
var Types = append(append([]string(nil), TaskTypes...), RolloutTypes...)

// ReservedPrefix starts the keys of leasepool's own documents in the tasks
// table (such as flows stored before they were documents): they are not
// users' tasks and yield no events.
const ReservedPrefix = task.ReservedPrefix

// Event is one lifecycle event of one task, or of one rollout (Rollout
// set, Key and Kind empty).
type Event struct {
	Type string `json:"event"`
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// Rollout names the rollout of a rollout event; Wave is the index of
	// its wave (0 the first) and Seq the rollout's count of its events.
	Rollout  string `json:"rollout,omitempty"`
	Wave     int    `json:"wave,omitempty"`
	Seq      int64  `json:"seq,omitempty"`
	Attempt  int    `json:"attempt,omitempty"`
	Worker   string `json:"worker,omitempty"`
	Instance string `json:"instance,omitempty"`
	// By is the worker whose claim took over an expired lease.
	By    string `json:"by,omitempty"`
	Error string `json:"error,omitempty"`
	// Message is a Logged event's line, or a rollout event's detail.
	Message string    `json:"message,omitempty"`
	Until   time.Time `json:"until,omitzero"`
	// State is the task's state after the write (the rollout's, for a
	// rollout event).
	State task.State `json:"state"`
	// At is the write's store time; Version the version it stored.
	At      time.Time `json:"at"`
	Version int64     `json:"version"`
	// Token resumes a stream right after this event (Params.After).
	Token string `json:"token"`
}

// Derive returns the events of the write that stored t, in the order the
// write made them (expiries before the claim that took over).
func Derive(t *task.Task) []Event {
	if t == nil || strings.HasPrefix(t.Key, ReservedPrefix) {
		return nil
	}
	base := Event{Key: t.Key, Kind: t.Kind, State: t.State, At: t.UpdatedAt, Version: t.Version}
	var out []Event
	if t.Version == 1 {
		e := base
		e.Type, e.At = Published, t.CreatedAt
		out = append(out, e)
	}
	changes := t.WriteChanges()
	claimer := ""
	for _, c := range changes {
		if c.Op == task.ChangeClaimed {
			claimer = c.WorkerID
		}
	}
	for _, c := range changes {
		e := base
		e.Type, e.Worker, e.Instance, e.Attempt, e.Error = c.Op, c.WorkerID, c.Instance, c.Attempt, c.Error
		if c.Op == task.ChangeLogged {
			for _, l := range c.Log {
				line := e
				line.Message, line.At = l.Msg, l.At
				out = append(out, line)
			}
			continue
		}
		switch c.Op {
		case task.ChangeExpired:
			e.By = claimer
		case task.ChangeSnoozed, task.ChangeReset:
			e.Until = c.Until
		}
		out = append(out, e)
		if c.Op == task.ChangeFailed && !t.State.Finished() {
			r := base
			r.Type, r.Worker, r.Attempt, r.Until = Retried, c.WorkerID, c.Attempt, t.NextClaimAt
			out = append(out, r)
		}
	}
	return out
}

// DeriveClaims returns the claimed events of the write that stored
// version v, told from t, the document after a later write (a change
// stream that looks documents up when it reads them): each attempt keeps
// the version of its claim's write (task.Attempt.ClaimVersion), in
// Workers or, once it left them, in History. A claim leaves its task
// running and its attempt starts at the claim's store time, so these
// events equal those Derive gives from the claim's own document. The
// write's other events cannot be told from a later document and are not
// given.
func DeriveClaims(t *task.Task, v int64) []Event {
	if t == nil || v <= 1 || strings.HasPrefix(t.Key, ReservedPrefix) {
		return nil
	}
	var out []Event
	for _, ws := range [][]task.Attempt{t.History, t.Attempts} {
		for _, w := range ws {
			if w.ClaimVersion == v {
				out = append(out, Event{Type: Claimed, Key: t.Key, Kind: t.Kind, Attempt: w.Attempt, Worker: w.WorkerID,
					Instance: w.Instance, State: task.StateRunning, At: w.StartedAt, Version: v})
			}
		}
	}
	return out
}
