package flowgraph

import (
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

// FromFlow is the picture of f's current run at now, laid out. It reads
// the exported document only; AddTasks adds the attempts of the step
// tasks.
func FromFlow(f *flow.Flow, now time.Time) *Graph {
	g := &Graph{Key: f.Key, State: string(f.State), Gen: f.Gen, Now: now}
	explicit := false // with no step naming a need, each needs the one before
	for _, st := range f.Steps {
		explicit = explicit || len(st.Needs) > 0
	}
	for i, st := range f.Steps {
		nd := Node{Name: st.Name, Type: string(st.StepType()), HasRollback: st.Rollback != nil, MaxFailedNeeds: st.MaxFailedNeeds}
		if nd.Type == string(flow.TypeTask) {
			nd.Kind = st.Action.Kind
		}
		switch {
		case explicit:
			nd.Needs = st.Needs
		case i > 0:
			nd.Needs = []string{f.Steps[i-1].Name}
		}
		var recorded flow.StepState
		if i < len(f.Progress) {
			p := f.Progress[i]
			nd.Do, nd.Undo, recorded, nd.Reason = runOf(p.Do), runOf(p.Undo), p.State, p.Reason
			nd.Signalled = p.Signal != nil
		}
		nd.State = stateOf(nd, recorded)
		g.Nodes = append(g.Nodes, nd)
	}
	g.Layout()
	return g
}

func runOf(r flow.Run) Run {
	out := Run{State: string(r.State), Task: r.Task, Start: r.StartedAt, End: r.EndedAt, Due: r.Due, Error: r.Error,
		Attempts: max(r.Attempts, r.Attempt)}
	if r.State == flow.RunFailed {
		out.Attempts = max(out.Attempts, r.Failures)
	} else if r.State != flow.RunNone {
		out.Attempts = max(out.Attempts, r.Failures+1)
	}
	return out
}

// stateOf is a step's state: the one the flow recorded, else (a document
// written before steps had one) the rollback's once it started, else the
// forward work's. A signal or sleep step that runs is awaiting.
func stateOf(nd Node, recorded flow.StepState) State {
	st := State(recorded)
	if st == "" {
		st = fromRuns(nd)
	}
	if st == Running && (nd.Type == string(flow.TypeSignal) || nd.Type == string(flow.TypeSleep)) {
		return Awaiting
	}
	if !slices.Contains(States, st) {
		return Waiting // a state this version does not know
	}
	return st
}

func fromRuns(nd Node) State {
	switch nd.Undo.State {
	case "active":
		return RollingBack
	case "succeeded":
		return RolledBack
	case "failed", "cancelled":
		return RollbackFailed
	}
	switch nd.Do.State {
	case "active":
		return Running
	case "succeeded":
		return Succeeded
	case "failed":
		return Failed
	case "cancelled":
		return Cancelled
	}
	return Waiting
}

// TaskKeys are the keys of the runs' tasks, to read for AddTasks.
func (g *Graph) TaskKeys() []string {
	var keys []string
	for _, nd := range g.Nodes {
		for _, r := range []Run{nd.Do, nd.Undo} {
			if r.Task != "" {
				keys = append(keys, r.Task)
			}
		}
	}
	return keys
}

// AddTasks puts each run's attempts, from its task's attempt history, on
// the time line; a run whose task is not in tasks keeps one span for the
// whole run.
func (g *Graph) AddTasks(tasks map[string]*task.Task) {
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		for _, r := range []*Run{&nd.Do, &nd.Undo} {
			t := tasks[r.Task]
			if r.Task == "" || t == nil || (r == &nd.Do && nd.Type != string(flow.TypeTask)) {
				continue // a signal or sleep step's task is its timer, not its work
			}
			r.Spans = r.Spans[:0]
			for _, a := range t.AttemptHistory() {
				sp := Span{Start: a.StartedAt, End: a.EndedAt, Attempt: a.Attempt, Error: firstLine(a.Error)}
				switch {
				case a.Expired(g.Now):
					sp.Outcome = "expired"
				case a.State == task.AttemptRunning:
					sp.Outcome = "running"
				case a.State == task.AttemptSuccess:
					sp.Outcome = "succeeded"
				case a.State == task.AttemptExpired:
					sp.Outcome = "expired"
				default:
					sp.Outcome = "failed"
				}
				r.Spans = append(r.Spans, sp)
			}
			r.Attempts = max(r.Attempts, len(r.Spans))
		}
	}
}

// Spans are r's attempts, or one span for the whole run when none is
// known.
func (r Run) spans() []Span {
	if len(r.Spans) > 0 || r.Start.IsZero() {
		return r.Spans
	}
	out := "running"
	switch r.State {
	case "succeeded", "failed", "cancelled":
		out = r.State
	}
	return []Span{{Start: r.Start, End: r.End, Attempt: r.Attempts, Outcome: out, Error: r.Error}}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
