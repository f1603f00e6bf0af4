package main

// `leasepool flow show`: the flow page's picture as text.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/mattn/go-isatty"
	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/flowgraph"
)

func flowShow(c *cli.Context) error {
	key, err := oneKey(c)
	if err != nil {
		return err
	}
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	f, err := flow.Get(c.Context, s, key)
	if err != nil {
		return err
	}
	if len(f.Steps) > largeFlowSteps && !c.Bool("all") {
		return flowShowLevels(c, f)
	}
	g := flowgraph.FromFlow(f, s.Now())
	if c.Bool("json") {
		// The stored document, with the picture's levels and rollback
		// order beside its fields.
		b, err := json.Marshal(f)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			return err
		}
		doc["graph"] = g.Summary()
		return writeJSON(c.App.Writer, doc)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "flow %s: %s, %s, run %d, updated %s\n", flowgraph.Clean(f.Key), f.State, flowgraph.Clean(cursorText(f)), f.Gen, stamp(f.UpdatedAt))
	if f.Error != "" {
		fmt.Fprintf(w, "error: %s\n", flowgraph.Clean(f.Error))
	}
	if err := g.Text(w, colourOut(w)); err != nil {
		return err
	}
	fmt.Fprintln(w, "params:")
	for _, k := range sortedKeys(f) {
		fmt.Fprintf(w, "  %s: %s\n", flowgraph.Clean(k), flowgraph.Clean(string(f.Params[k])))
	}
	if len(f.Events) > 0 {
		fmt.Fprintln(w, "events:")
		for _, e := range f.Events {
			fmt.Fprintf(w, "  %s  %s  %s  %s\n", stamp(e.At), e.Type, flowgraph.Clean(e.Step), flowgraph.Clean(e.Message))
		}
	}
	return nil
}

// colourOut reports whether w is a terminal that takes colours (NO_COLOR
// unset): off a terminal the text is plain.
func colourOut(w any) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd()) && os.Getenv("NO_COLOR") == ""
}

const (
	// largeFlowSteps: a flow of more steps is shown by levels, unless --all.
	largeFlowSteps = 200
	// levelPageSteps is the steps of one page of a level.
	levelPageSteps = 20
)

// flowShowLevels prints a large flow: its levels with the count of steps
// in each state, and a page of each level's steps (of --level's only),
// failing steps first; with --json the same as JSON beside the flow's own
// fields. Its time and size do not grow with the steps beyond one pass.
func flowShowLevels(c *cli.Context, f *flow.Flow) error {
	levels := flow.Levels(f)
	page, only := c.Int("page"), c.Int("level")
	if page < 1 {
		return badFlag(c, "page", "must be at least 1, got %d", page)
	}
	if only < 0 || only > len(levels) {
		return badFlag(c, "level", "the flow has levels 1 to %d, not %d", len(levels), only)
	}
	type stepLine struct {
		N        int            `json:"n"`
		Name     string         `json:"name"`
		State    flow.StepState `json:"state"`
		Reason   string         `json:"reason,omitempty"`
		Attempts int            `json:"attempts,omitempty"`
		Error    string         `json:"error,omitempty"`
		Needs    []string       `json:"needs,omitempty"`
	}
	type levelOut struct {
		Level  int                    `json:"level"`
		Steps  int                    `json:"steps"`
		Counts map[flow.StepState]int `json:"counts"`
		Page   int                    `json:"page"`
		Pages  int                    `json:"pages"`
		Shown  []stepLine             `json:"shown"`
	}
	var out []levelOut
	for _, l := range levels {
		if only > 0 && l.Depth != only {
			continue
		}
		lo := levelOut{Level: l.Depth, Steps: len(l.Steps), Counts: l.Counts, Page: page,
			Pages: max(1, (len(l.Steps)+levelPageSteps-1)/levelPageSteps)}
		from, to := min(len(l.Steps), (page-1)*levelPageSteps), min(len(l.Steps), page*levelPageSteps)
		for _, i := range l.Steps[from:to] {
			p := f.Progress[i]
			e := p.Do.Error
			if p.Undo.Error != "" {
				e = p.Undo.Error
			}
			lo.Shown = append(lo.Shown, stepLine{N: i + 1, Name: f.Steps[i].Name, State: p.State, Reason: p.Reason,
				Attempts: p.Do.Attempts, Error: e, Needs: f.Steps[i].Needs})
		}
		out = append(out, lo)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, map[string]any{"key": f.Key, "state": f.State, "gen": f.Gen, "error": f.Error,
			"steps": len(f.Steps), "created_at": f.CreatedAt, "updated_at": f.UpdatedAt, "events": f.Events, "levels": out})
	}
	w := c.App.Writer
	fmt.Fprintf(w, "flow %s: %s, %d steps in %d levels, run %d, updated %s\n", flowgraph.Clean(f.Key), f.State, len(f.Steps), len(levels), f.Gen, stamp(f.UpdatedAt))
	if f.Error != "" {
		fmt.Fprintf(w, "error: %s\n", flowgraph.Clean(f.Error))
	}
	for _, l := range out {
		var counts []string
		for _, st := range flow.StepStates {
			if n := l.Counts[st]; n > 0 {
				counts = append(counts, fmt.Sprintf("%d %s", n, st))
			}
		}
		fmt.Fprintf(w, "level %d: %d steps: %s\n", l.Level, l.Steps, strings.Join(counts, ", "))
		if len(l.Shown) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, st := range l.Shown {
			needs := "-"
			if len(st.Needs) > 0 {
				needs = flowgraph.Clean(strings.Join(st.Needs, ","))
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%s\n", st.N, flowgraph.Clean(st.Name), st.State, st.Attempts, needs,
				flowgraph.Clean(cmp.Or(st.Error, st.Reason)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if l.Pages > 1 {
			fmt.Fprintf(w, "  (page %d of %d, failing steps first: --level %d --page N for more, --all for every step)\n", l.Page, l.Pages, l.Level)
		}
	}
	if len(f.Events) > 0 {
		fmt.Fprintln(w, "events:")
		for _, e := range f.Events {
			fmt.Fprintf(w, "  %s  %s  %s  %s\n", stamp(e.At), e.Type, flowgraph.Clean(e.Step), flowgraph.Clean(e.Message))
		}
	}
	return nil
}
