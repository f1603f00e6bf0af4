package task

// The changes a write noted in the document, so that a reader who has only
// the document after that write (a change stream event) can tell what the
// write did without the document before it (package events).

import "time"

// Change names, noted by the mutations in state.go. Entries that a write
// takes out of the worker list (release, snooze, unpin, reset) leave no
// trace in the list itself, and timestamps alone cannot tell two writes in
// one (millisecond) tick apart: hence a note keyed by version.
const (
	ChangeClaimed   = "claimed"   // Claim: WorkerID, Attempt
	ChangeExpired   = "expired"   // Reap (also inside Claim): the expired entry's WorkerID, Attempt
	ChangeSucceeded = "succeeded" // Succeed
	ChangeFailed    = "failed"    // Fail: Error; Until is the retry time asked for
	ChangeReleased  = "released"  // Release
	ChangeSnoozed   = "snoozed"   // Snooze: Until
	ChangeUnpinned  = "unpinned"  // Unpin
	ChangeCancelled = "cancelled" // Cancel
	ChangeReset     = "reset"     // Reset (publish with rerun, retry)
	// ChangeLogged: the handler logged Log (Job.Log) since the attempt's
	// previous write; a renewal or the outcome write carries them.
	ChangeLogged = "logged"
)

// Change is one lifecycle change made by the write that stored version
// Task.ChangesVersion.
type Change struct {
	Op       string    `json:"op"`
	WorkerID string    `json:"worker_id,omitempty"`
	Instance string    `json:"instance,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	Error    string    `json:"error,omitempty"`
	Until    time.Time `json:"until,omitzero"`
	Log      []LogLine `json:"log,omitempty"`
}

// WriteChanges returns the changes made by the write that stored t, or
// none when that write made no lifecycle change (a renewal, an option
// edit, an insert).
func (t *Task) WriteChanges() []Change {
	if t.ChangesVersion != t.Version {
		return nil
	}
	return t.Changes
}

// note records c as made by the coming write. Every mutation of one write
// sees the same Version (the store bumps it on Update), so notes of one
// write gather, and the first note of the next write drops the old ones.
func (t *Task) note(c Change) {
	if t.ChangesVersion != t.Version+1 {
		t.ChangesVersion, t.Changes = t.Version+1, nil
	}
	t.Changes = append(t.Changes, c)
}

// noteWorker notes op for worker entry w.
func (t *Task) noteWorker(op string, w Attempt) {
	t.note(Change{Op: op, WorkerID: w.WorkerID, Instance: w.Instance, Attempt: w.Attempt, Error: w.Error})
}
