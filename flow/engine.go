package flow

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// The pure transitions of a flow document. Every one runs inside the
// compare-and-set loop on the freshly read document, so two observers of
// one outcome (a step's worker and the reconciler) apply it once: the
// second finds the run no longer active and changes nothing.
//
// The rules, which docs/flows.md states for users:
//   - A step starts when every step it needs has succeeded; steps ready
//     together start together, each its own task (or signal wait, or
//     timer).
//   - A step that fails after its retries (a signal step whose wait timed
//     out without a default) turns the flow rolling_back: no step starts
//     any more, task steps running finish (with their retries) and are
//     rolled back like the rest, and signal and sleep steps still waiting
//     are cancelled.
//   - Rollback: every step whose work started and that has a rollback is
//     undone. A step's rollback starts once its own work has ended and
//     every step that needs it, directly or through other steps, has not
//     started, or has ended its work and its rollback (if it has one).
//     As a step starts only after what it needs succeeded, this is the
//     reverse of completion order along every chain of needs; steps on
//     separate branches roll back in parallel. A linear flow rolls back
//     strictly in reverse.
//   - A rollback that fails after its retries starts no further
//     rollbacks; once the running ones end the flow is rollback_failed.
//   - A step with max_failed_needs counts the failures of what it needs
//     instead (tolerate.go states how).

// outcome is what became of one attempt of a step's work or rollback.
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

// runRef names one run (a step's do or undo) of a flow.
type runRef struct {
	Step int
	Undo bool
}

func (f *Flow) run(i int, undo bool) *Run {
	if undo {
		return &f.Progress[i].Undo
	}
	return &f.Progress[i].Do
}

// start moves a pending flow to its first steps.
func (f *Flow) start(at time.Time) bool {
	if f.State != StatePending {
		return false
	}
	f.State = StateRunning
	f.advance(at)
	return true
}

// apply records o; it reports false when o is not for a run the flow
// waits on (stale, or recorded already).
func (f *Flow) apply(o outcome) bool {
	if f.State.Finished() || o.Gen != f.Gen || o.Step < 0 || o.Step >= len(f.Steps) {
		return false
	}
	i, undo := o.Step, o.Undo
	r := f.run(i, undo)
	if r.State != RunActive {
		return false
	}
	if o.Success && !undo && paramsSize(f.Params)+len(f.Steps[i].Name)+len(o.Result) > MaxParamsSize {
		// Kept, the result would grow the flow document past what the
		// store takes, and the flow could never move again: the step fails.
		o.Success, o.Final = false, true
		o.Error = fmt.Sprintf("result of %d bytes does not fit: the shared parameters would pass %d bytes", len(o.Result), MaxParamsSize)
	}
	r.Attempts = max(r.Attempts, o.Attempt)
	name := f.Steps[i].Name
	if !o.Success {
		r.Failures++
		r.Error = o.Error
		if !o.Final {
			return true
		}
		r.State, r.EndedAt, r.Attempt = RunFailed, o.At, o.Attempt
		if undo {
			msg := fmt.Sprintf("rollback of step %d (%s) failed: %s", i+1, name, o.Error)
			f.Error = msg
			f.addEvent(Event{At: o.At, Type: EventRollbackFailed, Step: name, Message: msg})
		} else {
			f.ended(i)
			msg := fmt.Sprintf("step %d (%s) failed: %s", i+1, name, o.Error)
			if f.State == StateRunning {
				why, ok := f.tolerate(i, o.At)
				if ok {
					f.addEvent(Event{At: o.At, Type: EventStepFailed, Step: name, Message: msg + " (tolerated)"})
					f.advance(o.At)
					return true
				}
				if why != "" {
					msg += "; " + why
				}
			}
			if f.State != StateRollingBack || f.Error == "" {
				f.Error = msg // the first failure says why the flow rolls back
			}
			f.addEvent(Event{At: o.At, Type: EventStepFailed, Step: name, Message: msg})
			f.failWaits(o.At)
		}
		f.advance(o.At)
		return true
	}
	r.State, r.EndedAt, r.Attempt, r.Error = RunSucceeded, o.At, o.Attempt, ""
	if !undo {
		f.setResult(i, o.Result)
		f.ended(i)
	}
	f.advance(o.At)
	return true
}

func (f *Flow) setResult(i int, result json.RawMessage) {
	if f.Params == nil {
		f.Params = map[string]json.RawMessage{}
	}
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	f.Params[f.Steps[i].Name] = result
}

// ended gives step i, whose work just ended, its place in completion order.
func (f *Flow) ended(i int) {
	n := 0
	for _, p := range f.Progress {
		n = max(n, p.Order)
	}
	f.Progress[i].Order = n + 1
}

// failWaits turns a running flow rolling_back: signal and sleep steps
// still waiting are cancelled (their timers stopped), task steps run on.
func (f *Flow) failWaits(at time.Time) {
	if f.State != StateRunning {
		return
	}
	f.State = StateRollingBack
	for i, st := range f.Steps {
		r := &f.Progress[i].Do
		if st.StepType() != TypeTask && r.State == RunActive {
			r.State, r.EndedAt = RunCancelled, at
			f.stopTask(r.Task)
		}
	}
}

// stopTask notes a task the caller must cancel once the write is stored.
func (f *Flow) stopTask(key string) {
	if key != "" {
		f.stops = append(f.stops, key)
	}
}

// advance starts what may start now: steps whose needs all succeeded
// (running), or rollbacks whose dependents are done (rolling_back), and
// ends the flow when nothing is left to run.
func (f *Flow) advance(at time.Time) {
	needs := f.graph().needs
	switch f.State {
	case StateRunning:
		for started := true; started; {
			// A step that ends as it starts (a signal sent before it was
			// ready) may make others ready: go round again.
			started = false
			for i := range f.Steps {
				if f.Progress[i].Do.State != RunNone || !f.needsMet(i, needs[i]) {
					continue
				}
				// No earlier than what it needs ended, whatever the clocks
				// of the writers that recorded them said.
				start := at
				for _, k := range needs[i] {
					start = latest(start, f.Progress[k].Do.EndedAt)
				}
				f.startDo(i, start)
				started = started || f.Progress[i].Do.State == RunSucceeded
			}
		}
		// A running flow holds no failed step but those it tolerated.
		if slices.IndexFunc(f.Progress, func(p Progress) bool { return !runEnded(p.Do) }) < 0 {
			f.State, f.Error = StateSucceeded, ""
			f.addEvent(Event{At: at, Type: EventSucceeded})
		}
	case StateRollingBack:
		f.startUndos(needs, at)
	}
}

// needsMet reports whether step i may start: every step it needs has
// succeeded, or, for a step with max_failed_needs, has ended with no more
// than that many failed.
func (f *Flow) needsMet(i int, needs []int) bool {
	failed := 0
	for _, k := range needs {
		switch r := f.Progress[k].Do; {
		case r.State == RunFailed && f.Steps[i].MaxFailedNeeds > 0:
			failed++
		case r.State != RunSucceeded:
			return false
		}
	}
	return failed <= f.Steps[i].MaxFailedNeeds
}

// startDo starts step i's work: its task, its timer, or its wait for a
// signal (which ends at once when the signal came first).
func (f *Flow) startDo(i int, at time.Time) {
	st := f.Steps[i]
	f.State, f.Cursor = StateRunning, i
	r := Run{State: RunActive, StartedAt: at}
	switch st.StepType() {
	case TypeTask:
		r.Task = StepKey(f.Key, f.Gen, i, st.Name, false)
	case TypeSleep:
		r.Task, r.Due = StepKey(f.Key, f.Gen, i, st.Name, false), st.Until
		if st.Sleep > 0 {
			r.Due = at.Add(time.Duration(st.Sleep))
		}
	case TypeSignal:
		if sig := f.Progress[i].Signal; sig != nil {
			r.State, r.EndedAt = RunSucceeded, at
			f.Progress[i].Do = r
			f.setResult(i, sig.Payload)
			f.ended(i)
			return
		}
		if st.Timeout > 0 {
			r.Task, r.Due = StepKey(f.Key, f.Gen, i, st.Name, false), at.Add(time.Duration(st.Timeout))
		}
	}
	f.Progress[i].Do = r
	f.started = append(f.started, runRef{Step: i})
}

// startUndos starts every rollback whose turn has come (see the rules
// above); with none running and none to start, the flow has failed, or,
// when a rollback failed, is rollback_failed.
func (f *Flow) startUndos(needs [][]int, at time.Time) {
	failed := false
	for _, p := range f.Progress {
		failed = failed || p.Undo.State == RunFailed
	}
	if !failed {
		kept := f.contained()
		clear, last := f.undoWay(needs, kept)
		for i := range f.Steps {
			if !f.undoes(i, kept) || f.Progress[i].Undo.State != RunNone || f.Progress[i].Do.State == RunActive {
				continue
			}
			st, p := f.Steps[i], f.Progress[i]
			if clear[i] {
				start := latest(latest(at, p.Do.EndedAt), last[i])
				f.State, f.Cursor = StateRollingBack, i
				f.Progress[i].Undo = Run{State: RunActive, Task: StepKey(f.Key, f.Gen, i, st.Name, true), StartedAt: start}
				f.started = append(f.started, runRef{Step: i, Undo: true})
			}
		}
	}
	for _, p := range f.Progress {
		if p.Do.State == RunActive || p.Undo.State == RunActive {
			return
		}
	}
	if failed {
		f.State = StateRollbackFailed
		return
	}
	f.State = StateFailed
	f.addEvent(Event{At: at, Type: EventRolledBack, Message: f.Error})
}

// undoWay returns, for each step, whether every step that needs it,
// directly or through others, is undone (no longer in its rollback's
// way), and the latest end of their rollbacks: one pass over the steps,
// dependents first, rather than each step's dependents walked anew.
func (f *Flow) undoWay(needs [][]int, kept []bool) (clear []bool, last []time.Time) {
	n := len(f.Steps)
	clear, last = make([]bool, n), make([]time.Time, n)
	g := f.graph()
	if g.topo == nil { // a cycle: not in a stored flow; walk each step's dependents
		deps := dependents(needs)
		for i := range n {
			clear[i] = !slices.ContainsFunc(deps[i], func(d int) bool { return !f.undone(d, kept) })
			for _, d := range deps[i] {
				last[i] = latest(last[i], f.Progress[d].Undo.EndedAt)
			}
		}
		return clear, last
	}
	for j := n - 1; j >= 0; j-- {
		i := g.topo[j]
		clear[i] = true
		for _, d := range g.direct[i] {
			clear[i] = clear[i] && clear[d] && f.undone(d, kept)
			last[i] = latest(last[i], latest(last[d], f.Progress[d].Undo.EndedAt))
		}
	}
	return clear, last
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// undoes reports whether step i is rolled back once its turn comes: it
// has a rollback, its work started, and it is not a failure contained by
// a max_failed_needs step (kept: f.contained()).
func (f *Flow) undoes(i int, kept []bool) bool {
	do := f.Progress[i].Do.State
	return f.Steps[i].Rollback != nil && do != RunNone && (do != RunFailed || !kept[i])
}

// undone reports whether step d no longer stands in a rollback's way: it
// never started, or its work ended and its rollback (if any) succeeded.
func (f *Flow) undone(d int, kept []bool) bool {
	p := f.Progress[d]
	switch {
	case p.Do.State == RunNone:
		return true
	case p.Do.State == RunActive:
		return false
	}
	return !f.undoes(d, kept) || p.Undo.State == RunSucceeded
}

// cancel stops the flow: every run active is marked cancelled and its
// task noted to stop. With rollback the started steps are undone.
func (f *Flow) cancel(rollback bool, at time.Time) error {
	switch {
	case f.State.Finished():
		return fmt.Errorf("cancel %s: %w (it is %s)", f.Key, ErrFinished, f.State)
	case f.State == StatePending:
		f.State = StateCancelled
		f.addEvent(Event{At: at, Type: EventCancelled, Message: "cancelled before the first step"})
		return nil
	case f.State == StateRollingBack && rollback:
		return nil // already doing what was asked
	}
	var names []string
	for i := range f.Steps {
		for _, undo := range []bool{false, true} {
			if r := f.run(i, undo); r.State == RunActive {
				r.State, r.EndedAt = RunCancelled, at
				f.stopTask(r.Task)
				names = append(names, f.Steps[i].Name)
			}
		}
	}
	msg := "cancelled"
	if len(names) > 0 {
		msg = fmt.Sprintf("cancelled at step %s", strings.Join(names, ", "))
	}
	step := ""
	if len(names) == 1 {
		step = names[0]
	}
	if rollback {
		f.Error = msg
		f.addEvent(Event{At: at, Type: EventCancelled, Step: step, Message: msg + "; rolling back"})
		f.State = StateRollingBack
		f.advance(at)
		return nil
	}
	f.State, f.Error = StateCancelled, msg
	f.addEvent(Event{At: at, Type: EventCancelled, Step: step, Message: msg})
	return nil
}

// standing reports whether step i's work is done and not undone.
func (f *Flow) standing(i int) bool {
	p := f.Progress[i]
	return p.Do.State == RunSucceeded && p.Undo.State == RunNone
}

// retry starts a new run generation in which every step whose work does
// not stand runs again: after a full rollback, every step; after a
// cancel without rollback, the ones that had not succeeded.
func (f *Flow) retry(at time.Time) error {
	switch {
	case f.State == StateSucceeded:
		return fmt.Errorf("retry %s: %w: it succeeded", f.Key, ErrFinished)
	case !f.State.Finished():
		return fmt.Errorf("retry %s: %w (it is %s)", f.Key, ErrNotFinished, f.State)
	}
	from := -1
	f.Gen++
	for j := range f.Steps {
		if f.standing(j) {
			continue
		}
		if from < 0 {
			from = j
		}
		f.Progress[j] = Progress{}
		delete(f.Params, f.Steps[j].Name) // a result of the run before
	}
	f.allDirty = true
	f.Error = ""
	f.addEvent(Event{At: at, Type: EventRetried, Message: fmt.Sprintf("from step %d", from+1)})
	f.State = StateRunning
	f.advance(at)
	return nil
}

// summarise sets each step's State from its runs, and a skipped step's
// Reason.
func (f *Flow) summarise() {
	needs := f.graph().needs
	for i := range f.Progress {
		p := &f.Progress[i]
		p.Reason = ""
		switch {
		case p.Undo.State == RunActive:
			p.State = StepRollingBack
		case p.Undo.State == RunSucceeded:
			p.State = StepRolledBack
		case p.Undo.State == RunFailed:
			p.State = StepRollbackFailed
		case p.Undo.State == RunCancelled, p.Do.State == RunCancelled:
			p.State = StepCancelled
		case p.Do.State == RunActive:
			p.State = StepRunning
		case p.Do.State == RunSucceeded:
			p.State = StepSucceeded
		case p.Do.State == RunFailed && p.Do.StartedAt.IsZero():
			// Never started: tolerate recorded its work failed with the
			// step it needs, for the steps counting failures to count.
			p.State, p.Reason = StepSkipped, p.Do.Error
		case p.Do.State == RunFailed:
			p.State = StepFailed
		case f.State == StatePending || f.State == StateRunning:
			p.State = StepWaiting
		default:
			p.State, p.Reason = StepSkipped, f.skipReason(i, needs[i])
		}
	}
}

// skipReason says why step i, which never started in a flow that starts
// no more steps, never will: a max_failed_needs passed, else the step it
// needs that failed (or was cancelled, or never started itself), else the
// flow stopped before its needs were met.
func (f *Flow) skipReason(i int, needs []int) string {
	st := f.Steps[i]
	if st.MaxFailedNeeds > 0 {
		n := 0
		for _, k := range needs {
			if f.Progress[k].Do.State == RunFailed {
				n++
			}
		}
		if n > st.MaxFailedNeeds {
			return fmt.Sprintf("%d of the %d steps it needs failed, more than its max_failed_needs (%d)", n, len(needs), st.MaxFailedNeeds)
		}
	}
	why, rank := "the flow stopped first", 0
	for _, k := range needs {
		r, name := f.Progress[k].Do, f.Steps[k].Name
		switch {
		case r.State == RunFailed && !r.StartedAt.IsZero():
			return fmt.Sprintf("needs %s, which failed", name)
		case r.State == RunCancelled && rank < 2:
			why, rank = fmt.Sprintf("needs %s, which was cancelled", name), 2
		case (r.State == RunNone || r.State == RunFailed) && rank < 1:
			why, rank = fmt.Sprintf("needs %s, which was skipped", name), 1
		}
	}
	return why
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
