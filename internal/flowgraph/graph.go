// Package flowgraph is the picture of one flow run: its steps as a DAG laid
// out in levels (a step's level is the longest path to it from a step that
// needs nothing), each step's state, attempts and times, the rollback path
// when it ran, and the attempts on a time line. The dashboard draws it as
// SVG (SVG, Timeline) and `leasepool flow show` prints it (Text).
//
// The graph reads only what FromFlow copies out of a flow document, so a
// forged document (a cycle, a need of no step, two steps of one name)
// still draws: every loop here is bounded by the number of steps and
// edges, and what does not fit is reported (Graph.Cyclic, Graph.Unknown).
package flowgraph

import (
	"cmp"
	"slices"
	"time"
)

// State is a step's state as the picture shows it: its forward work's,
// or its rollback's once that started.
type State string

const (
	Waiting        State = "waiting"         // not started: a step it needs has not succeeded yet
	Running        State = "running"         // its task is queued or running
	Awaiting       State = "awaiting"        // a signal step waiting for its signal, a sleep step for its time
	Succeeded      State = "succeeded"       // done
	Failed         State = "failed"          // failed after its retries
	Cancelled      State = "cancelled"       // stopped while started
	Skipped        State = "skipped"         // never started: a step it needs failed, or the flow stopped first
	RollingBack    State = "rolling_back"    // its rollback is queued or running
	RolledBack     State = "rolled_back"     // its rollback succeeded
	RollbackFailed State = "rollback_failed" // its rollback failed after its retries
)

// States lists every state in the legend's order.
var States = []State{Waiting, Running, Awaiting, Succeeded, Failed, Cancelled, Skipped, RollingBack, RolledBack, RollbackFailed}

// Run is one direction (do or undo) of one step.
type Run struct {
	// State is the flow's record: "", active, succeeded, failed,
	// cancelled.
	State string
	// Task is the key of the run's task, if it has one.
	Task string
	// Attempts counts the attempts made (0: not started).
	Attempts int
	// Start and End bound the run; End is zero while it runs.
	Start, End time.Time
	// Due is when a sleep step's timer fires or a signal step's wait
	// times out.
	Due   time.Time
	Error string
	// Spans are the run's attempts on the time line, oldest first
	// (from the step task's attempt history; one span for the whole run
	// when there is none, as for a signal or sleep step).
	Spans []Span
}

// Took is the run's duration, zero unless it ended.
func (r Run) Took() time.Duration {
	if r.Start.IsZero() || r.End.IsZero() || r.End.Before(r.Start) {
		return 0
	}
	return r.End.Sub(r.Start)
}

// Span is one attempt on the time line.
type Span struct {
	Start, End time.Time // End zero: still running
	Attempt    int
	// Outcome: running, succeeded, failed, expired, cancelled, released.
	Outcome string
	Error   string
}

// Node is one step.
type Node struct {
	Name string
	// Type is task, signal or sleep.
	Type  string
	Kind  string
	Needs []string
	// MaxFailedNeeds is how many of Needs may fail with the step still
	// starting (the flow step's max_failed_needs; 0: none may).
	MaxFailedNeeds int
	State          State
	// Reason says why a skipped step never started.
	Reason string
	Do     Run
	// Undo is the rollback's run; HasRollback says whether the step has
	// one at all.
	Undo        Run
	HasRollback bool
	// Signalled says a signal step's signal arrived.
	Signalled bool
	// Level is the longest path from a root; Row the place in the level,
	// in step order.
	Level, Row int
	// RollbackN is the step's place in the rollback order (from 1), 0 if
	// it was not rolled back.
	RollbackN int
}

// Edge is a need: From (the needed step) before To, as node indices.
type Edge struct{ From, To int }

// Graph is a flow run laid out.
type Graph struct {
	Key   string
	State string
	Gen   int
	Now   time.Time
	Nodes []Node
	Edges []Edge
	// Levels holds the node indices of each level, in step order.
	Levels [][]int
	// Rollback is the node indices in the order their rollbacks started.
	Rollback []int
	// Cyclic names the steps on or behind a cycle of needs (a forged
	// document: publish refuses cycles); they are drawn in one last level.
	Cyclic []string
	// Unknown lists needs that name no step ("step: need").
	Unknown []string
}

// Layout fills the edges, levels, rows and rollback order from the nodes'
// needs and runs. It runs in time linear in the steps and needs, whatever
// they hold.
func (g *Graph) Layout() {
	n := len(g.Nodes)
	index := make(map[string]int, n)
	for i, nd := range g.Nodes {
		if _, dup := index[nd.Name]; !dup {
			index[nd.Name] = i // a second step of one name gets no edges in
		}
	}
	g.Edges, g.Unknown, g.Cyclic, g.Levels, g.Rollback = nil, nil, nil, nil, nil
	out := make([][]int, n)
	indeg := make([]int, n)
	for to, nd := range g.Nodes {
		seen := map[int]bool{}
		for _, need := range nd.Needs {
			from, ok := index[need]
			if !ok {
				g.Unknown = append(g.Unknown, nd.Name+": "+need)
				continue
			}
			if seen[from] {
				continue
			}
			seen[from] = true
			g.Edges = append(g.Edges, Edge{From: from, To: to})
			out[from] = append(out[from], to)
			indeg[to]++
		}
	}
	// Kahn's algorithm: each node leaves the queue once, each edge is
	// followed once. A node's level is settled when its last need is.
	level := make([]int, n)
	queue := make([]int, 0, n)
	for i := range n {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	done := make([]bool, n)
	for head := 0; head < len(queue); head++ {
		u := queue[head]
		done[u] = true
		for _, v := range out[u] {
			level[v] = max(level[v], level[u]+1)
			if indeg[v]--; indeg[v] == 0 {
				queue = append(queue, v)
			}
		}
	}
	last := 0
	for i := range n {
		if done[i] {
			last = max(last, level[i]+1)
		}
	}
	for i := range n {
		if !done[i] {
			level[i] = last
			g.Cyclic = append(g.Cyclic, g.Nodes[i].Name)
		}
	}
	for i := range n {
		l := level[i]
		for len(g.Levels) <= l {
			g.Levels = append(g.Levels, nil)
		}
		g.Nodes[i].Level, g.Nodes[i].Row = l, len(g.Levels[l])
		g.Levels[l] = append(g.Levels[l], i)
	}
	for i, nd := range g.Nodes {
		g.Nodes[i].RollbackN = 0
		if !nd.Undo.Start.IsZero() {
			g.Rollback = append(g.Rollback, i)
		}
	}
	// Rollbacks in the order they started; at one instant, the later step
	// first (as the engine undoes them).
	slices.SortStableFunc(g.Rollback, func(a, b int) int {
		if c := g.Nodes[a].Undo.Start.Compare(g.Nodes[b].Undo.Start); c != 0 {
			return c
		}
		return cmp.Compare(b, a)
	})
	for k, i := range g.Rollback {
		g.Nodes[i].RollbackN = k + 1
	}
}

// MaxRows is the most steps in one level.
func (g *Graph) MaxRows() int {
	m := 0
	for _, l := range g.Levels {
		m = max(m, len(l))
	}
	return m
}

// Order is the node indices level by level, each level in step order: the
// order of the text and of the time line's rows.
func (g *Graph) Order() []int {
	var o []int
	for _, l := range g.Levels {
		o = append(o, l...)
	}
	return o
}
