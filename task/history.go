package task

// A task's attempt history: the worker list holds only the entries the
// claim logic reads (running, succeeded, failed, expired, and cancelled
// ones until a rerun), so preempt.Decide and CountWorkers stay as cheap
// as they were; every entry a mutation takes out of it (released, snoozed,
// unpinned, and all of them at a rerun) moves to History, capped.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Bounds on History, since every write of a task (a renewal too)
// rewrites the whole document.
const (
	// MaxHistory is how many attempts History keeps: the latest ones;
	// HistoryDropped counts the older ones left out.
	MaxHistory = 50
	// MaxHistoryOutput bounds the results, log lines and errors History
	// keeps, in bytes: past it, older entries keep only their error's
	// first line (OutputDropped). With entries of about 300 bytes besides,
	// history adds at most about 80 KiB to a document.
	MaxHistoryOutput = 64 << 10
)

// Terminal states of entries that left the worker list (History only),
// and of a running entry when its task is cancelled.
const (
	WorkerReleased  AttemptState = "RELEASED"  // given back: graceful stop, or the task finished by others
	WorkerSnoozed   AttemptState = "SNOOZED"   // given back with a delay (Snooze)
	WorkerUnpinned  AttemptState = "UNPINNED"  // its worker was dropped from the pins
	WorkerCancelled AttemptState = "CANCELLED" // still running when the task was cancelled
)

// archive moves worker entry i into History as st, ended at now.
func (t *Task) archive(i int, st AttemptState, now time.Time) {
	w := t.Attempts[i]
	w.State = st
	if w.EndedAt.IsZero() {
		w.EndedAt = now.UTC()
	}
	t.Attempts = slices.Delete(t.Attempts, i, i+1)
	t.keep(w)
}

// keep appends w to History, dropping the oldest beyond MaxHistory and
// the output of the older ones beyond MaxHistoryOutput.
func (t *Task) keep(ws ...Attempt) {
	t.History = append(t.History, ws...)
	if n := len(t.History) - MaxHistory; n > 0 {
		t.History = slices.Delete(t.History, 0, n)
		t.HistoryDropped += n
	}
	size := 0
	for i := len(t.History) - 1; i >= 0; i-- {
		w := &t.History[i]
		size += outputSize(*w)
		if size > MaxHistoryOutput && !w.OutputDropped {
			w.LogDropped += len(w.Log)
			w.Result, w.Log, w.OutputDropped = nil, nil, true
			w.Error = cut(strings.SplitN(w.Error, "\n", 2)[0], MaxLogLineLen)
		}
	}
}

// outputSize is about how many bytes w's result, log and error take.
func outputSize(w Attempt) int {
	n := len(w.Result) + len(w.Error)
	for _, l := range w.Log {
		n += len(l.Msg) + 40 // the line's time and JSON around it
	}
	return n
}

// endRunning ends every RUNNING entry as st at now (Cancel: CANCELLED,
// Reset: RELEASED), so no entry stays RUNNING once its task no longer
// runs. The lease is kept: a handler still running learns of the end at
// its next ping, and Reset waits for that lease before a rerun.
func (t *Task) endRunning(st AttemptState, why string, now time.Time) {
	for i := range t.Attempts {
		if w := &t.Attempts[i]; w.State == AttemptRunning {
			w.State, w.EndedAt, w.Error = st, now.UTC(), why
		}
	}
}

// AttemptHistory returns every attempt t recorded, oldest first: History, then
// the worker list (HistoryDropped says how many older ones were left out).
func (t *Task) AttemptHistory() []Attempt {
	all := make([]Attempt, 0, len(t.History)+len(t.Attempts))
	all = append(append(all, t.History...), t.Attempts...)
	slices.SortStableFunc(all, func(a, b Attempt) int { return cmp.Compare(a.Attempt, b.Attempt) })
	return all
}

// RecordCancelled stores out on h's entry that a cancel ended (see
// Record), so what a cancelled handler logged is kept. It changes nothing
// else and notes only the lines logged since (ChangeLogged); it fails with ErrLeaseLost unless h's entry is
// still in the worker list as CANCELLED.
func (t *Task) RecordCancelled(h Holder, out Output) error {
	if i := t.Entry(h); i < 0 || t.Attempts[i].State != WorkerCancelled {
		return fmt.Errorf("task %s attempt %d: no cancelled entry: %w", t.Key, h.Attempt, ErrLeaseLost)
	}
	t.Record(h, out)
	return nil
}
