// Package tasktest holds the task fixtures that the tests of task and
// consumer/internal/preempt share: a fixed instant and builders of
// validated tasks and of their workers, so that both judge the same
// documents.
package tasktest

import (
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// T0 is the instant every fixture is published and recomputed at.
var T0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Params returns the smallest valid publish parameters: key "k", kind
// "noop".
func Params() task.PublishParams {
	return task.PublishParams{Key: "k", Kind: "noop"}
}

// New builds a validated task published at T0 from Params with edit
// applied, adds workers (raising Attempts to the highest of theirs) and
// recomputes the derived fields at T0.
func New(t testing.TB, edit func(p *task.PublishParams), workers ...task.Attempt) *task.Task {
	t.Helper()
	p := Params()
	if edit != nil {
		edit(&p)
	}
	tk, err := task.NewTask(p, T0)
	if err != nil {
		t.Fatal(err)
	}
	tk.Attempts = append(tk.Attempts, workers...)
	for _, w := range workers {
		tk.AttemptsStarted = max(tk.AttemptsStarted, w.Attempt)
	}
	tk.Recompute(T0)
	return tk
}

// Running is a worker running attempt since a second before T0, its lease
// ending at lease.
func Running(id string, attempt int, lease time.Time) task.Attempt {
	return task.Attempt{WorkerID: id, State: task.AttemptRunning, Attempt: attempt, LeaseUntil: lease, StartedAt: T0.Add(-time.Second)}
}

// Ended is a worker whose attempt ended in st a second before T0.
func Ended(id string, attempt int, st task.AttemptState) task.Attempt {
	return task.Attempt{WorkerID: id, State: st, Attempt: attempt, StartedAt: T0.Add(-time.Minute), EndedAt: T0.Add(-time.Second)}
}
