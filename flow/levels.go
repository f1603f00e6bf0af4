package flow

import (
	"slices"
)

// Level is one level of a flow's DAG, for readers of large flows (the
// dashboard, flow show): the steps whose longest chain of needs back to
// a step that needs none is Depth steps long (1: those roots).
type Level struct {
	Depth int
	// Steps are the level's step indexes, the ones needing a look first
	// (StateRank), then in step order.
	Steps []int
	// Counts is how many of the level's steps stand in each state.
	Counts map[StepState]int
}

// Levels returns f's levels, in depth order, in time linear in the steps
// and needs.
func Levels(f *Flow) []Level {
	g := f.graph()
	depth := make([]int, len(f.Steps))
	order := g.topo
	if order == nil { // a cycle: not in a stored flow; every step on one level
		order = make([]int, len(f.Steps))
		for i := range order {
			order[i] = i
		}
	}
	var levels []Level
	for _, i := range order {
		d := 1
		if g.topo != nil {
			for _, k := range g.needs[i] {
				d = max(d, depth[k]+1)
			}
		}
		depth[i] = d
		for len(levels) < d {
			levels = append(levels, Level{Depth: len(levels) + 1, Counts: map[StepState]int{}})
		}
	}
	for i, p := range f.Progress {
		l := &levels[depth[i]-1]
		l.Steps = append(l.Steps, i)
		l.Counts[p.State]++
	}
	for _, l := range levels {
		slices.SortStableFunc(l.Steps, func(a, b int) int {
			return StateRank(f.Progress[a].State) - StateRank(f.Progress[b].State)
		})
	}
	return levels
}

// StateRank orders step states by how much they need a look: failures
// first, then what is moving, then what waits or ended well.
func StateRank(s StepState) int {
	switch s {
	case StepRollbackFailed:
		return 0
	case StepFailed:
		return 1
	case StepRollingBack:
		return 2
	case StepRunning:
		return 3
	case StepCancelled:
		return 4
	case StepRolledBack:
		return 5
	case StepSkipped:
		return 6
	case StepWaiting:
		return 7
	}
	return 8 // succeeded
}

// StepStates lists the step states in StateRank order.
var StepStates = []StepState{StepRollbackFailed, StepFailed, StepRollingBack, StepRunning, StepCancelled,
	StepRolledBack, StepSkipped, StepWaiting, StepSucceeded}
