package flow

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// The pure transitions of a flow document. Every one runs inside the
// compare-and-set loop on the freshly read document, so two observers of
// one outcome (a step's worker and the reconciler) apply it once: the
// second finds the cursor moved and changes nothing.

// outcome is what became of one attempt of the action a flow waits on.
type outcome struct {
	Gen     int
	Step    int
	Undo    bool
	Success bool
	// Final: a failure with no retries left.
	Final   bool
	Result  json.RawMessage
	Error   string
	Attempt int
	At      time.Time
}

// current returns the action the flow waits on: step index and direction.
func (f *Flow) current() (i int, undo bool, ok bool) {
	switch f.State {
	case StateRunning:
		return f.Cursor, false, true
	case StateRollingBack:
		return f.Cursor, true, true
	}
	return 0, false, false
}

func (f *Flow) run(i int, undo bool) *Run {
	if undo {
		return &f.Progress[i].Undo
	}
	return &f.Progress[i].Do
}

// start moves a pending flow to its first step.
func (f *Flow) start(at time.Time) bool {
	if f.State != StatePending {
		return false
	}
	f.startDo(0, at)
	return true
}

// apply records o; it reports false when o is not for the action the flow
// waits on (stale, or recorded already).
func (f *Flow) apply(o outcome) bool {
	i, undo, ok := f.current()
	if !ok || o.Gen != f.Gen || i != o.Step || undo != o.Undo {
		return false
	}
	if o.Success && !undo && paramsSize(f.Params)+len(f.Steps[i].Name)+len(o.Result) > MaxParamsSize {
		// Kept, the result would grow the flow document past what the
		// store takes, and the flow could never move again: the step fails.
		o.Success, o.Final = false, true
		o.Error = fmt.Sprintf("result of %d bytes does not fit: the shared parameters would pass %d bytes", len(o.Result), MaxParamsSize)
	}
	r := f.run(i, undo)
	name := f.Steps[i].Name
	if !o.Success {
		r.Failures++
		r.Error = o.Error
		if !o.Final {
			return true
		}
		r.State, r.EndedAt, r.Attempt = RunFailed, o.At, o.Attempt
		if undo {
			f.State = StateRollbackFailed
			f.Error = fmt.Sprintf("rollback of step %d (%s) failed: %s", i+1, name, o.Error)
			f.addEvent(Event{At: o.At, Type: EventRollbackFailed, Step: name, Message: f.Error})
			return true
		}
		f.Error = fmt.Sprintf("step %d (%s) failed: %s", i+1, name, o.Error)
		f.addEvent(Event{At: o.At, Type: EventStepFailed, Step: name, Message: f.Error})
		f.startUndo(i, o.At)
		return true
	}
	r.State, r.EndedAt, r.Attempt, r.Error = RunSucceeded, o.At, o.Attempt, ""
	if undo {
		f.startUndo(i-1, o.At)
		return true
	}
	if f.Params == nil {
		f.Params = map[string]json.RawMessage{}
	}
	result := o.Result
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	f.Params[name] = result
	f.startDo(i+1, o.At)
	return true
}

func (f *Flow) startDo(i int, at time.Time) {
	if i >= len(f.Steps) {
		f.State, f.Cursor, f.Error = StateSucceeded, len(f.Steps)-1, ""
		f.addEvent(Event{At: at, Type: EventSucceeded})
		return
	}
	f.State, f.Cursor = StateRunning, i
	f.Progress[i].Do = Run{State: RunActive, Task: StepKey(f.Key, f.Gen, i, f.Steps[i].Name, false), StartedAt: at}
}

// startUndo starts the rollback of the latest step at or before i that
// has one and was started; with none left the flow has failed (rolled back).
func (f *Flow) startUndo(i int, at time.Time) {
	for ; i >= 0; i-- {
		if f.Steps[i].Rollback != nil && f.Progress[i].Do.State != RunNone {
			f.State, f.Cursor = StateRollingBack, i
			f.Progress[i].Undo = Run{State: RunActive, Task: StepKey(f.Key, f.Gen, i, f.Steps[i].Name, true), StartedAt: at}
			return
		}
	}
	f.State = StateFailed
	f.addEvent(Event{At: at, Type: EventRolledBack, Message: f.Error})
}

// cancel stops the flow: the action running is marked cancelled and its
// task key returned so the caller cancels the task. With rollback the
// started steps are undone from the cancelled one back.
func (f *Flow) cancel(rollback bool, at time.Time) (stop string, err error) {
	switch {
	case f.State.Finished():
		return "", fmt.Errorf("cancel %s: %w (it is %s)", f.Key, ErrFinished, f.State)
	case f.State == StatePending:
		f.State = StateCancelled
		f.addEvent(Event{At: at, Type: EventCancelled, Message: "cancelled before the first step"})
		return "", nil
	case f.State == StateRollingBack && rollback:
		return "", nil // already doing what was asked
	}
	i, undo, _ := f.current()
	r := f.run(i, undo)
	r.State, r.EndedAt = RunCancelled, at
	stop = r.Task
	msg := fmt.Sprintf("cancelled at step %d (%s)", i+1, f.Steps[i].Name)
	if rollback && !undo {
		f.Error = msg
		f.addEvent(Event{At: at, Type: EventCancelled, Step: f.Steps[i].Name, Message: msg + "; rolling back"})
		f.startUndo(i, at)
		return stop, nil
	}
	f.State, f.Error = StateCancelled, msg
	f.addEvent(Event{At: at, Type: EventCancelled, Step: f.Steps[i].Name, Message: msg})
	return stop, nil
}

// standing reports whether step i's work is done and not undone.
func (f *Flow) standing(i int) bool {
	p := f.Progress[i]
	return p.Do.State == RunSucceeded && p.Undo.State == RunNone
}

// retry starts a new run generation from the first step whose work is not
// standing: after a full rollback that is the first step; after a cancel
// without rollback, the cancelled one.
func (f *Flow) retry(at time.Time) error {
	switch {
	case f.State == StateSucceeded:
		return fmt.Errorf("retry %s: %w: it succeeded", f.Key, ErrFinished)
	case !f.State.Finished():
		return fmt.Errorf("retry %s: %w (it is %s)", f.Key, ErrNotFinished, f.State)
	}
	from := 0
	for from < len(f.Steps) && f.standing(from) {
		from++
	}
	f.Gen++
	for j := from; j < len(f.Steps); j++ {
		f.Progress[j] = Progress{}
		delete(f.Params, f.Steps[j].Name) // a result of the run before
	}
	f.Error = ""
	f.addEvent(Event{At: at, Type: EventRetried, Message: fmt.Sprintf("from step %d", from+1)})
	f.startDo(from, at)
	return nil
}

// MaxParamsSize bounds a flow's shared parameters (request and results),
// leaving the rest of the flow document, and of each step's envelope,
// room under task.MaxPayloadSize.
const MaxParamsSize = task.MaxPayloadSize / 2

func paramsSize(p map[string]json.RawMessage) int {
	n := 0
	for k, v := range p {
		n += len(k) + len(v)
	}
	return n
}
