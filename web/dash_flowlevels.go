package web

// The flow page of a large flow (more than largeFlowSteps steps): no
// drawing of every step, but its levels with the count of steps in each
// state, and one page of one level's steps, failing steps first. The page
// reads the flow once and no step task: its size and time do not grow
// with the flow's steps beyond one pass over them.

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/leasepool/leasepool/flow"
)

const (
	// largeFlowSteps: a flow of more steps is shown by levels.
	largeFlowSteps = 200
	// levelPageSteps is the steps of one page of a level.
	levelPageSteps = 50
	// signalsShown bounds the awaiting signal steps the page offers.
	signalsShown = 20
)

// flowLevels is a large flow's page: its levels, and the shown page of one.
type flowLevels struct {
	Levels []levelRow
	// Level is the depth shown, Page its page (both from 1) of Pages.
	Level, Page, Pages int
	First, Last        int // the shown steps' places in the level, from 1
	Steps              []flowStep
	Prev, Next         string // the URLs of the pages around, or ""
}

// levelRow is one level's line: its steps in each state, failing first.
type levelRow struct {
	Depth, Total int
	Counts       []stateCount
	URL          string
	Shown        bool
}

type stateCount struct {
	State flow.StepState
	N     int
}

// levelsOf builds the page of f at the level and page that q asks for
// (level: the first one with a step failing or moving, else 1).
func levelsOf(f *flow.Flow, q url.Values) (flowLevels, error) {
	levels := flow.Levels(f)
	out := flowLevels{Level: 0, Page: 1}
	pageURL := func(level, page int) string {
		v := url.Values{"key": {f.Key}, "level": {strconv.Itoa(level)}}
		if page > 1 {
			v.Set("page", strconv.Itoa(page))
		}
		return "/flow?" + v.Encode()
	}
	if s := q.Get("level"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > len(levels) {
			return out, badInput("level", "%q is not a level of the flow (1 to %d)", s, len(levels))
		}
		out.Level = n
	}
	if s := q.Get("page"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return out, badInput("page", "%q is not a page number (1 or more)", s)
		}
		out.Page = n
	}
	for _, l := range levels {
		row := levelRow{Depth: l.Depth, Total: len(l.Steps), URL: pageURL(l.Depth, 1)}
		for _, st := range flow.StepStates {
			if n := l.Counts[st]; n > 0 {
				row.Counts = append(row.Counts, stateCount{st, n})
			}
		}
		if out.Level == 0 && len(l.Steps) > 0 && flow.StateRank(f.Progress[l.Steps[0]].State) <= flow.StateRank(flow.StepCancelled) {
			out.Level = l.Depth
		}
		out.Levels = append(out.Levels, row)
	}
	if out.Level == 0 {
		out.Level = 1
	}
	out.Levels[out.Level-1].Shown = true
	steps := levels[out.Level-1].Steps
	out.Pages = max(1, (len(steps)+levelPageSteps-1)/levelPageSteps)
	if out.Page > out.Pages {
		return out, badInput("page", "%d is past the level's last page (%d)", out.Page, out.Pages)
	}
	lo, hi := (out.Page-1)*levelPageSteps, min(len(steps), out.Page*levelPageSteps)
	out.First, out.Last = lo+1, hi
	for _, i := range steps[lo:hi] {
		out.Steps = append(out.Steps, stepRow(f, i))
	}
	if out.Page > 1 {
		out.Prev = pageURL(out.Level, out.Page-1)
	}
	if out.Page < out.Pages {
		out.Next = pageURL(out.Level, out.Page+1)
	}
	return out, nil
}

// stepRow is step i's line of the steps table.
func stepRow(f *flow.Flow, i int) flowStep {
	st := f.Steps[i]
	return flowStep{N: i + 1, Step: st, Prog: f.Progress[i], Result: prettyJSON(f.Params[st.Name]),
		Current: f.Progress[i].Do.State == flow.RunActive || f.Progress[i].Undo.State == flow.RunActive}
}

// awaitingSignals lists the signal steps of f waiting for their signal,
// at most signalsShown of them.
func awaitingSignals(f *flow.Flow) []awaitingSignal {
	var out []awaitingSignal
	if f.State.Finished() {
		return nil
	}
	for i, st := range f.Steps {
		p := f.Progress[i]
		if st.StepType() == flow.TypeSignal && p.Do.State == flow.RunActive && p.Signal == nil && len(out) < signalsShown {
			out = append(out, awaitingSignal{N: i, Name: st.Name, Since: p.Do.StartedAt, Due: p.Do.Due})
		}
	}
	return out
}

// Note says which steps of which level the page shows.
func (l flowLevels) Note() string {
	return fmt.Sprintf("level %d, steps %d to %d of %d", l.Level, l.First, l.Last, l.Levels[l.Level-1].Total)
}
