package flow

import (
	"fmt"
	"time"
)

// Tolerated failures: a step with MaxFailedNeeds (a fan-in over a fleet)
// counts the failures of the steps it needs instead of letting the first
// one stop the flow.
//
//   - Such a step starts once every step it needs has ended, succeeded or
//     failed after its retries, provided at most MaxFailedNeeds failed.
//   - A step that needs a failed step and has no MaxFailedNeeds never
//     starts: its work is recorded failed with it ("needs update-3,
//     which failed"), and the steps that need it see one more failure.
//     Readers see it skipped, with that reason (summarise).
//   - A failure is contained when every chain of needs leading from the
//     failed step reaches a step with MaxFailedNeeds (a step nothing needs
//     ends no chain there). A contained failure stops nothing while each
//     counting step it reaches has at most MaxFailedNeeds failed needs;
//     past that the flow fails and rolls back by the usual rule.
//   - A contained failed step is not rolled back, whatever the flow does
//     next: its own work failed, and what the fleet rolls back is what
//     changed. Without MaxFailedNeeds anywhere no failure is contained and
//     the rules are those of engine.go.

// validateMaxFailedNeeds checks a step's max_failed_needs: not negative,
// only on a step that names its needs, and no more than it names (all of
// them may fail: a step that runs however its needs end).
func validateMaxFailedNeeds(st Step, field string) error {
	switch n := st.MaxFailedNeeds; {
	case n == 0:
		return nil
	case n < 0:
		return invalid(field, "must not be negative")
	case len(st.Needs) == 0:
		return invalid(field, "the step names no needs to count failures of")
	case n > len(st.Needs):
		return invalid(field, fmt.Sprintf("%d is more than the %d steps the step needs", n, len(st.Needs)))
	}
	return nil
}

// directDependents returns, for each step, the steps that need it directly.
func directDependents(needs [][]int) [][]int {
	out := make([][]int, len(needs))
	for i, ns := range needs {
		for _, k := range ns {
			out[k] = append(out[k], i)
		}
	}
	return out
}

// failureReach follows a failure of step k along the steps that need it:
// the steps that cannot start because of it (they have no
// MaxFailedNeeds), the counting steps where it stops, and whether it is
// contained (no chain of needs from k ends at a step nothing needs
// without reaching a counting step).
func failureReach(steps []Step, direct [][]int, k int) (blocked, counting []int, contained bool) {
	seen := make([]bool, len(steps))
	seen[k] = true
	contained = true
	for queue := []int{k}; len(queue) > 0; queue = queue[1:] {
		x := queue[0]
		if len(direct[x]) == 0 {
			contained = false
		}
		for _, d := range direct[x] {
			if seen[d] {
				continue
			}
			seen[d] = true
			if steps[d].MaxFailedNeeds > 0 {
				counting = append(counting, d)
				continue
			}
			blocked = append(blocked, d)
			queue = append(queue, d)
		}
	}
	return blocked, counting, contained
}

// contained reports, for each step, whether its failure is contained: it
// is then never rolled back.
func (f *Flow) contained() []bool {
	out := make([]bool, len(f.Steps))
	tolerant := false
	for _, st := range f.Steps {
		tolerant = tolerant || st.MaxFailedNeeds > 0
	}
	if !tolerant {
		return out
	}
	direct := f.graph().direct
	for i := range f.Steps {
		_, _, out[i] = failureReach(f.Steps, direct, i)
	}
	return out
}

// tolerate decides on the failure of step k's work, in a running flow:
// when it is contained and no counting step it reaches has more failed
// needs than it tolerates, the steps it blocks fail with it and it
// reports true. Otherwise it changes nothing and says why, when a
// counting step's limit was passed.
func (f *Flow) tolerate(k int, at time.Time) (string, bool) {
	g := f.graph()
	needs := g.needs
	blocked, counting, contained := failureReach(f.Steps, g.direct, k)
	if !contained {
		return "", false
	}
	failed := make([]bool, len(f.Steps))
	failed[k] = true
	for _, b := range blocked {
		failed[b] = true
	}
	for _, d := range counting {
		n := 0
		for _, x := range needs[d] {
			if failed[x] || f.Progress[x].Do.State == RunFailed {
				n++
			}
		}
		if st := f.Steps[d]; n > st.MaxFailedNeeds {
			return fmt.Sprintf("%d of the %d steps %s needs failed, more than its max_failed_needs (%d)",
				n, len(needs[d]), st.Name, st.MaxFailedNeeds), false
		}
	}
	for _, b := range blocked {
		// A blocked step never started: nothing but this failure (or an
		// earlier one, already recorded) can have ended it.
		if r := &f.Progress[b].Do; r.State == RunNone {
			*r = Run{State: RunFailed, EndedAt: at, Error: fmt.Sprintf("needs %s, which failed", f.Steps[k].Name)}
		}
	}
	return "", true
}

// runEnded reports whether a step's work has ended for a counting step:
// succeeded, or failed after its retries.
func runEnded(r Run) bool { return r.State == RunSucceeded || r.State == RunFailed }
