// Package preempt is the pure claim logic: may worker W claim task T now,
// and if not, when to look again; and the bounded heap of claim times the
// consumer schedules from. It does no I/O; the mutations themselves are
// task.Task's methods.
package preempt

import (
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Verdict is the outcome of Decide.
type Verdict int

const (
	// Never: W cannot claim T until T changes (finished, pinned elsewhere,
	// W already succeeded on it).
	Never Verdict = iota
	// Later: look again at Decision.At (delayed, or full until a lease ends).
	Later
	// Claim: W may claim now.
	Claim
	// Reap: nobody may claim, but expired workers exhaust the retries, so
	// the task must be written as failed (see Reap).
	Reap
)

func (v Verdict) String() string {
	return [...]string{"never", "later", "claim", "reap"}[v]
}

// Decision says whether and when a worker may claim a task.
type Decision struct {
	Verdict Verdict
	At      time.Time // for Later
	Reason  string
}

// ErrNotClaimable is returned by Claim when Decide does not say Claim.
var ErrNotClaimable = errors.New("not claimable")

// Decide applies the claim rule of docs/tasks.md for workerID at store time now.
// Lock keys are not checked here: they live outside the document.
//
// A worker whose own earlier attempt failed or expired may claim again (a
// single-worker deployment must be able to retry); a worker with a RUNNING
// or SUCCESS entry may not, so concurrent and successful workers are
// distinct.
func Decide(t *task.Task, workerID string, now time.Time) Decision {
	if t.State.Finished() {
		return Decision{Verdict: Never, Reason: string(t.State)}
	}
	if !t.Allows(workerID) {
		return Decision{Verdict: Never, Reason: "pinned to other workers"}
	}
	for _, w := range t.Attempts {
		if w.WorkerID != workerID {
			continue
		}
		if w.State == task.AttemptSuccess {
			return Decision{Verdict: Never, Reason: "already succeeded here"}
		}
		if w.Live(now) {
			// Normally this worker is running it; but a worker restarted
			// under the same id must look again when that lease ends.
			return Decision{Verdict: Later, At: w.LeaseUntil, Reason: "already running here"}
		}
	}
	c := t.CountWorkers(now)
	if c.Unexpected+c.Expired > t.MaxUnexpectedRetries {
		return Decision{Verdict: Reap, Reason: "retries exhausted by expired workers"}
	}
	if now.Before(t.RunAt) {
		return Decision{Verdict: Later, At: t.RunAt, Reason: "delayed"}
	}
	if c.Success >= t.SuccessWorkerCnt {
		return Decision{Verdict: Never, Reason: "enough successes"}
	}
	if c.Live >= t.ConcurrentWorkerCnt {
		at := time.Time{}
		for _, w := range t.Attempts {
			if w.Live(now) && (at.IsZero() || w.LeaseUntil.Before(at)) {
				at = w.LeaseUntil
			}
		}
		return Decision{Verdict: Later, At: at, Reason: "all worker slots leased"}
	}
	return Decision{Verdict: Claim}
}

// ClaimTask decides the claim for who (worker id and instance) and returns
// a copy of t with the claim applied (see task.Task.Claim) and the new
// attempt's holder. The caller writes it with compare-and-set.
func ClaimTask(t *task.Task, who task.Holder, now time.Time) (*task.Task, task.Holder, error) {
	if d := Decide(t, who.WorkerID, now); d.Verdict != Claim {
		return nil, task.Holder{}, fmt.Errorf("claim %s: %w: %s", t.Key, ErrNotClaimable, d.Reason)
	}
	next := t.Clone()
	return next, next.Claim(who, now), nil
}
