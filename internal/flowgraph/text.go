package flowgraph

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// colours are the terminal colours of the states (ANSI; each code the
// same length, so tabwriter's columns stay aligned).
var colours = map[State]string{
	Waiting: "\x1b[90m", Running: "\x1b[34m", Awaiting: "\x1b[35m", Succeeded: "\x1b[32m", Failed: "\x1b[31m",
	Cancelled: "\x1b[90m", Skipped: "\x1b[90m", RollingBack: "\x1b[33m", RolledBack: "\x1b[33m", RollbackFailed: "\x1b[31m",
}

// Text prints the steps level by level (1 first) with their kind (or
// type), state, attempts, time taken, needs and rollback, then their
// errors, the rollback order and
// any cycle or unknown need. colour adds ANSI colours to the states (for
// a terminal); names are cleaned of control characters either way.
func (g *Graph) Text(w io.Writer, colour bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LEVEL\tSTEP\tKIND\tSTATE\tATTEMPTS\tTOOK\tNEEDS\tROLLBACK")
	for _, i := range g.Order() {
		nd := g.Nodes[i]
		state := string(nd.State)
		if colour {
			state = colours[nd.State] + state + "\x1b[0m"
		}
		needs := "-"
		if len(nd.Needs) > 0 {
			needs = Clean(strings.Join(nd.Needs, ","))
		}
		if nd.MaxFailedNeeds > 0 {
			needs += fmt.Sprintf(" (max_failed_needs %d)", nd.MaxFailedNeeds)
		}
		kind := nd.Kind // a task step's kind; signal, sleep
		if nd.Type != "task" || kind == "" {
			kind = nd.Type
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", nd.Level+1, Clean(nd.Name), Clean(kind), state,
			nd.Do.Attempts, orDash(Dur(runTime(nd.Do, g.Now))), needs, nd.rollbackText(g))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, i := range g.Order() {
		nd := g.Nodes[i]
		if nd.State == Skipped && nd.Reason != "" {
			// A step skipped as a step it needs failed has that reason as
			// its work's error too: it is said once.
			fmt.Fprintf(w, "%s skipped: %s\n", Clean(nd.Name), Clean(nd.Reason))
			continue
		}
		for _, r := range []struct{ what, err string }{{"do", nd.Do.Error}, {"rollback", nd.Undo.Error}} {
			if r.err != "" {
				fmt.Fprintf(w, "%s %s error: %s\n", Clean(nd.Name), r.what, Clean(strings.ReplaceAll(r.err, "\n", " ")))
			}
		}
	}
	if len(g.Rollback) > 0 {
		parts := make([]string, len(g.Rollback))
		for k, i := range g.Rollback {
			parts[k] = fmt.Sprintf("%d %s", k+1, Clean(g.Nodes[i].Name))
		}
		fmt.Fprintf(w, "rollback order: %s\n", strings.Join(parts, ", "))
	}
	if len(g.Cyclic) > 0 {
		fmt.Fprintf(w, "cycle of needs (drawn last): %s\n", Clean(strings.Join(g.Cyclic, ", ")))
	}
	if len(g.Unknown) > 0 {
		fmt.Fprintf(w, "needs of no step: %s\n", Clean(strings.Join(g.Unknown, ", ")))
	}
	return nil
}

// rollbackText is the ROLLBACK column: none, -, or the rollback's place,
// state and time.
func (nd Node) rollbackText(g *Graph) string {
	switch {
	case !nd.HasRollback:
		return "none"
	case nd.Undo.Start.IsZero():
		return "-"
	}
	s := fmt.Sprintf("#%d %s", nd.RollbackN, orDash(nd.Undo.State))
	if d := Dur(runTime(nd.Undo, g.Now)); d != "" {
		s += " " + d
	}
	return s
}

// Summary is the picture as data, for `leasepool flow show --json`.
type Summary struct {
	Levels   [][]string    `json:"levels"`
	Steps    []StepSummary `json:"steps"`
	Rollback []string      `json:"rollback_order,omitempty"`
	Cyclic   []string      `json:"cyclic,omitempty"`
	Unknown  []string      `json:"unknown_needs,omitempty"`
}

// StepSummary is one step of a Summary.
type StepSummary struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`
	Level    int      `json:"level"`
	State    State    `json:"state"`
	Attempts int      `json:"attempts"`
	TookMS   int64    `json:"took_ms"`
	Needs    []string `json:"needs"`
	// MaxFailedNeeds is the step's max_failed_needs, 0 if none.
	MaxFailedNeeds int `json:"max_failed_needs,omitempty"`
	// RollbackN is the step's place in the rollback order, 0 if none.
	RollbackN int `json:"rollback_n,omitempty"`
}

// Summary is g as data: levels numbered from 0.
func (g *Graph) Summary() Summary {
	s := Summary{Levels: make([][]string, len(g.Levels)), Cyclic: g.Cyclic, Unknown: g.Unknown}
	for l, idx := range g.Levels {
		for _, i := range idx {
			s.Levels[l] = append(s.Levels[l], g.Nodes[i].Name)
		}
	}
	for _, i := range g.Order() {
		nd := g.Nodes[i]
		needs := nd.Needs
		if needs == nil {
			needs = []string{}
		}
		s.Steps = append(s.Steps, StepSummary{Name: nd.Name, Type: nd.Type, Level: nd.Level, State: nd.State,
			Attempts: nd.Do.Attempts, TookMS: runTime(nd.Do, g.Now).Milliseconds(), Needs: needs, MaxFailedNeeds: nd.MaxFailedNeeds,
			RollbackN: nd.RollbackN})
	}
	for _, i := range g.Rollback {
		s.Rollback = append(s.Rollback, g.Nodes[i].Name)
	}
	return s
}
