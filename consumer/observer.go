package consumer

import "time"

// Observer is told what the worker does, for metrics (package metrics
// implements it for Prometheus). Its methods are called synchronously on
// the worker's claim and run paths, from many goroutines at once: they
// must be safe for concurrent use, fast, and must not block. The events
// are structs so that fields can be added without breaking implementers.
//
// A middleware (Mux.Use) sees a handler's error but not what the worker
// then wrote: whether a failure is retried or final, or whether the lease
// was lost meanwhile. The observer is told the outcome as written.
type Observer interface {
	// Claimed is called once per claim written, before the handler starts.
	Claimed(ClaimEvent)
	// ClaimConflict is called for each compare-and-set conflict a claim
	// met (another writer changed the task between read and write), won or
	// lost in the end.
	ClaimConflict(kind string)
	// Finished is called once per claimed attempt, when it is over.
	Finished(FinishEvent)
}

// ClaimEvent describes a claim this worker wrote.
type ClaimEvent struct {
	Kind string
	// Group is the task's group, empty when it has none.
	Group   string
	Attempt int
	// Wait is how long the task had been claimable: the claim time (store
	// clock) minus the latest of its created_at, its run_at and the end of
	// any expired lease the claim takes over. A retried task counts from
	// its retry time, a snoozed one from the snooze's end, a taken-over one
	// from when its holder's lease ran out (the takeover delay); one
	// released on shutdown from its last run_at (its run included).
	Wait time.Duration
	// TakenOver is how many expired leases (crashed or frozen holders) the
	// claim recorded as failed and replaced.
	TakenOver int
}

// Outcome is how an attempt ended, as written to the store.
type Outcome string

// The outcomes of an attempt.
const (
	OutcomeSucceeded Outcome = "succeeded" // success written
	OutcomeRetried   Outcome = "retried"   // failure written; the task runs again at its next claim time
	OutcomeFailed    Outcome = "failed"    // failure written; retries exhausted, the task is failed
	OutcomeSnoozed   Outcome = "snoozed"   // given back without spending a retry
	OutcomeReleased  Outcome = "released"  // given back on shutdown
	// OutcomeLeaseLost: the lease was lost (expired and taken, unpinned)
	// before the outcome was written; nothing was written.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeCancelled: an operator cancelled the task while it ran.
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeTaskDone: other workers finished the task while this attempt
	// ran; it was stopped and released.
	OutcomeTaskDone Outcome = "task_done"
	// OutcomeNotWritten: the outcome write failed on store errors; the
	// lease will expire and a peer retries.
	OutcomeNotWritten Outcome = "not_written"
)

// FinishEvent describes the end of an attempt this worker claimed.
type FinishEvent struct {
	Kind string
	// Group is the task's group, empty when it has none.
	Group   string
	Attempt int
	Outcome Outcome
	// Started reports whether the handler ran: false when the claim landed
	// after its lease had ended (Outcome is then OutcomeLeaseLost).
	Started bool
	// Duration is how long the handler ran (local clock), zero when it did
	// not start.
	Duration time.Duration
}

// nopObserver is the default Observer.
type nopObserver struct{}

func (nopObserver) Claimed(ClaimEvent)   {}
func (nopObserver) ClaimConflict(string) {}
func (nopObserver) Finished(FinishEvent) {}
