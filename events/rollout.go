package events

// Rollout events: the lifecycle events a fleet rollout records in its
// document (package rollout), delivered on the same stream as task events.

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// RolloutNamespace is the task.Document namespace of rollouts (package
// rollout's Namespace, which events does not import): a stream carries
// its document writes.
const RolloutNamespace = "leasepool.rollout"

// Rollout event types, as package rollout records them. An Event of one of
// these names the rollout in Rollout, its wave's index in Wave and its
// detail in Message; its State is the rollout's state after the write.
const (
	RolloutCreated         = "rollout.created"
	RolloutWaveStarted     = "rollout.wave_started"
	RolloutWaveEnded       = "rollout.wave_ended"
	RolloutWaiting         = "rollout.waiting"
	RolloutApproved        = "rollout.approved"
	RolloutPaused          = "rollout.paused"
	RolloutResumed         = "rollout.resumed"
	RolloutAborted         = "rollout.aborted"
	RolloutCancelled       = "rollout.cancelled"
	RolloutCompleted       = "rollout.completed"
	RolloutRetrying        = "rollout.retrying"
	RolloutRollbackStarted = "rollout.rollback_started"
	RolloutRollbackEnded   = "rollout.rollback_ended"
)

// RolloutTypes lists the rollout event types.
var RolloutTypes = []string{RolloutCreated, RolloutWaveStarted, RolloutWaveEnded, RolloutWaiting, RolloutApproved,
	RolloutPaused, RolloutResumed, RolloutAborted, RolloutCancelled, RolloutCompleted, RolloutRetrying,
	RolloutRollbackStarted, RolloutRollbackEnded}

// maxRolloutDetail bounds a rollout event's Message: the rollout package
// writes short details; a longer one is a forged document's.
const maxRolloutDetail = 1024

// rolloutDoc is what events reads of a rollout's document: its state and
// its kept events, each with the version of the write that added it.
type rolloutDoc struct {
	State  string `json:"state"`
	Events []struct {
		Seq     int64     `json:"seq"`
		Type    string    `json:"type"`
		At      time.Time `json:"at"`
		Wave    int       `json:"wave"`
		Detail  string    `json:"detail"`
		Version int64     `json:"version"`
	} `json:"events"`
}

// DeriveRollout returns the rollout events of the write that stored d:
// those its document holds under d's version, oldest first. A document
// that is not a rollout's, or does not decode as one, yields none; so
// does an event of a type not in RolloutTypes.
func DeriveRollout(d *task.Document) []Event {
	if d == nil || d.Namespace != RolloutNamespace || d.Version <= 0 {
		return nil
	}
	var doc rolloutDoc
	if err := json.Unmarshal(d.Value, &doc); err != nil {
		return nil
	}
	if len(doc.State) > 32 {
		doc.State = "" // no rollout state is that long
	}
	var out []Event
	var seq int64
	for _, e := range doc.Events {
		if e.Version != d.Version || !isRolloutType(e.Type) || e.Seq <= seq {
			// Another write's, unknown, or out of order (forged: the
			// rollout package numbers its events in order).
			continue
		}
		seq = e.Seq
		msg := e.Detail
		if len(msg) > maxRolloutDetail {
			msg = strings.ToValidUTF8(msg[:maxRolloutDetail], "")
		}
		out = append(out, Event{Type: e.Type, Rollout: d.ID, Wave: max(e.Wave, 0), Seq: e.Seq, Message: msg,
			State: task.State(doc.State), At: e.At.UTC(), Version: d.Version})
	}
	return out
}

func isRolloutType(t string) bool {
	for _, x := range RolloutTypes {
		if x == t {
			return true
		}
	}
	return false
}
