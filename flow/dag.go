package flow

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// StepType is what a step does.
type StepType string

const (
	// TypeTask runs Action as a task (the default).
	TypeTask StepType = "task"
	// TypeSignal waits for a signal (Signal, the API, the CLI), holding no
	// lease and no worker slot; its payload becomes the step's result.
	TypeSignal StepType = "signal"
	// TypeSleep waits for a duration (Sleep) or until a time (Until),
	// holding nothing but a timer task due then.
	TypeSleep StepType = "sleep"
)

// StepType returns the step's type with the default filled in.
func (st Step) StepType() StepType {
	switch {
	case st.Type != "":
		return st.Type
	case st.Sleep != 0 || !st.Until.IsZero():
		return TypeSleep
	}
	return TypeTask
}

// StepState sums up where a step stands in the current run, for readers
// (the dashboard, flow show); the engine works from Progress's runs.
type StepState string

const (
	StepWaiting        StepState = "waiting"         // not started: a step it needs has not succeeded yet
	StepRunning        StepState = "running"         // started: its task is queued or running, its signal or timer awaited
	StepSucceeded      StepState = "succeeded"       // done; its result is params[name]
	StepFailed         StepState = "failed"          // failed after its retries (or its signal timed out)
	StepRollingBack    StepState = "rolling_back"    // its rollback is queued or running
	StepRolledBack     StepState = "rolled_back"     // its rollback succeeded
	StepRollbackFailed StepState = "rollback_failed" // its rollback failed after its retries
	StepCancelled      StepState = "cancelled"       // stopped while started: a cancel, or a wait ended by the flow's failure
	StepSkipped        StepState = "skipped"         // never started: a step it needs failed, or the flow stopped first (Progress.Reason says which)
)

// Limits of the DAG's fields.
var (
	// MinUntil and MaxUntil bound a sleep step's until.
	MinUntil = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxUntil = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// MaxSleep bounds a sleep step's sleep.
const MaxSleep = 10 * 366 * 24 * time.Hour

func (st Step) validate(field string) error {
	// Fields that belong to another type are refused rather than ignored:
	// a "sleep" on a task step is a mistake, not a no-op.
	noTask := func(typ StepType) error {
		a := st.Action
		switch {
		case a.Kind != "":
			return invalid(field+".kind", fmt.Sprintf("a %s step runs no task", typ))
		case len(a.Payload) > 0:
			return invalid(field+".payload", fmt.Sprintf("a %s step runs no task", typ))
		case a.Retries != nil:
			return invalid(field+".retries", fmt.Sprintf("a %s step runs no task", typ))
		case len(a.LockKeys) > 0:
			return invalid(field+".lock_keys", fmt.Sprintf("a %s step runs no task", typ))
		case a.Priority != 0:
			return invalid(field+".priority", fmt.Sprintf("a %s step runs no task", typ))
		case st.Rollback != nil:
			return invalid(field+".rollback", fmt.Sprintf("a %s step has nothing to undo", typ))
		}
		return nil
	}
	switch typ := st.StepType(); typ {
	case TypeTask:
		switch {
		case st.Sleep != 0:
			return invalid(field+".sleep", "only a sleep step sleeps")
		case !st.Until.IsZero():
			return invalid(field+".until", "only a sleep step sleeps")
		case len(st.Default) > 0:
			return invalid(field+".default", "only a signal step takes a default")
		}
		if err := st.Action.validate(field); err != nil {
			return err
		}
		if st.Rollback != nil {
			return st.Rollback.validate(field + ".rollback")
		}
	case TypeSignal:
		if err := noTask(typ); err != nil {
			return err
		}
		switch {
		case st.Sleep != 0:
			return invalid(field+".sleep", "only a sleep step sleeps")
		case !st.Until.IsZero():
			return invalid(field+".until", "only a sleep step sleeps")
		case st.Timeout < 0:
			return invalid(field+".timeout", "must not be negative")
		case len(st.Default) > 0 && st.Timeout == 0:
			return invalid(field+".default", "is taken when the timeout passes: give a timeout")
		case len(st.Default) > MaxParamsSize:
			return invalid(field+".default", fmt.Sprintf("larger than %d bytes", MaxParamsSize))
		}
		return task.ValidateJSON(field+".default", st.Default, task.MaxJSONDepth)
	case TypeSleep:
		if err := noTask(typ); err != nil {
			return err
		}
		switch {
		case st.Timeout != 0:
			return invalid(field+".timeout", "a sleep step has no timeout: it ends at its time")
		case len(st.Default) > 0:
			return invalid(field+".default", "only a signal step takes a default")
		case st.Sleep != 0 && !st.Until.IsZero():
			return invalid(field+".sleep", "give sleep or until, not both")
		case st.Sleep == 0 && st.Until.IsZero():
			return invalid(field+".sleep", `a sleep step needs sleep (a duration, "10m") or until (an RFC 3339 time)`)
		case st.Sleep < 0:
			return invalid(field+".sleep", "must be positive")
		case time.Duration(st.Sleep) > MaxSleep:
			return invalid(field+".sleep", fmt.Sprintf("longer than %s", MaxSleep))
		case !st.Until.IsZero() && (st.Until.Before(MinUntil) || st.Until.After(MaxUntil)):
			return invalid(field+".until", fmt.Sprintf("must lie between %d and %d", MinUntil.Year(), MaxUntil.Year()))
		}
	default:
		return invalid(field+".type", fmt.Sprintf("unknown type %q (want task, signal or sleep)", st.Type))
	}
	return nil
}

// validateNeeds checks the steps' needs: known names, none twice, none on
// itself, and no cycle. The names are valid and unique by now.
func validateNeeds(steps []Step) error {
	index := make(map[string]int, len(steps))
	for i, st := range steps {
		index[st.Name] = i
	}
	for i, st := range steps {
		field := fmt.Sprintf("steps[%d].needs", i)
		if err := validateMaxFailedNeeds(st, fmt.Sprintf("steps[%d].max_failed_needs", i)); err != nil {
			return err
		}
		if len(st.Needs) > len(steps) {
			return invalid(field, fmt.Sprintf("names %d steps; the flow has %d", len(st.Needs), len(steps)))
		}
		// A set, not a scan of the names before: a fan-in may need
		// thousands of steps.
		named := make(map[int]bool, len(st.Needs))
		for _, n := range st.Needs {
			k, ok := index[n]
			switch {
			case !ok:
				return invalid(field, fmt.Sprintf("%.80q names no step", n))
			case k == i:
				return invalid(field, fmt.Sprintf("%q needs itself", n))
			case named[k]:
				return invalid(field, fmt.Sprintf("%q named twice", n))
			}
			named[k] = true
		}
	}
	if cyc := findCycle(Needs(steps)); cyc != nil {
		names := make([]string, len(cyc))
		for i, k := range cyc {
			names[i] = steps[k].Name
		}
		names = append(names, steps[cyc[0]].Name)
		if n := len(names); n > 12 {
			// A cycle through thousands of steps, named in one line.
			names = slices.Concat(names[:5], []string{fmt.Sprintf("(%d more)", n-10)}, names[n-5:])
		}
		return invalid(fmt.Sprintf("steps[%d].needs", cyc[0]), "a cycle: "+strings.Join(names, " needs "))
	}
	return nil
}

// Needs returns each step's needs as step indexes: the named ones, or,
// in a flow where no step names any, the step before. Names are assumed
// valid (a stored flow's are); an unknown one is left out.
func Needs(steps []Step) [][]int {
	out := make([][]int, len(steps))
	explicit := false
	for _, st := range steps {
		if len(st.Needs) > 0 {
			explicit = true
			break
		}
	}
	if !explicit {
		for i := 1; i < len(steps); i++ {
			out[i] = []int{i - 1}
		}
		return out
	}
	index := make(map[string]int, len(steps))
	for i, st := range steps {
		index[st.Name] = i
	}
	for i, st := range steps {
		for _, n := range st.Needs {
			if k, ok := index[n]; ok {
				out[i] = append(out[i], k)
			}
		}
	}
	return out
}

// findCycle returns the steps of one cycle of needs (each needing the
// next, the last the first), or nil. Iterative: a chain of steps must not
// recurse as deep as it is long.
func findCycle(needs [][]int) []int {
	const (
		unseen = iota
		onPath
		done
	)
	mark := make([]int, len(needs))
	type frame struct{ node, next int }
	for root := range needs {
		if mark[root] != unseen {
			continue
		}
		path := []frame{{root, 0}}
		mark[root] = onPath
		for len(path) > 0 {
			top := &path[len(path)-1]
			if top.next == len(needs[top.node]) {
				mark[top.node] = done
				path = path[:len(path)-1]
				continue
			}
			k := needs[top.node][top.next]
			top.next++
			switch mark[k] {
			case onPath:
				var cyc []int
				for j := len(path) - 1; j >= 0; j-- {
					cyc = append(cyc, path[j].node)
					if path[j].node == k {
						break
					}
				}
				slices.Reverse(cyc)
				return cyc
			case unseen:
				mark[k] = onPath
				path = append(path, frame{k, 0})
			}
		}
	}
	return nil
}

// dependents returns, for each step, the steps that need it directly or
// through others.
func dependents(needs [][]int) [][]int {
	direct := make([][]int, len(needs))
	for i, ns := range needs {
		for _, k := range ns {
			direct[k] = append(direct[k], i)
		}
	}
	out := make([][]int, len(needs))
	for i := range needs {
		seen := make([]bool, len(needs))
		stack := slices.Clone(direct[i])
		for len(stack) > 0 {
			k := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[k] {
				continue
			}
			seen[k] = true
			out[i] = append(out[i], k)
			stack = append(stack, direct[k]...)
		}
		slices.Sort(out[i])
	}
	return out
}
