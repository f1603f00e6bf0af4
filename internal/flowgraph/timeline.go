package flowgraph

import (
	"fmt"
	"strings"
	"time"
)

// The time line's geometry.
const (
	tlLabel = 180 // the step names' column
	tlChart = 720
	tlRow   = 22
	tlAxis  = 30
	tlBar   = 14
	tlName  = 24 // runes of a name shown
)

// tickSteps are the time line's tick intervals, the first that leaves at
// most maxTicks ticks taken.
var tickSteps = []time.Duration{
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
	10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour,
	12 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
}

const maxTicks = 8

// Span returns the time line's start and end: the first attempt's start
// and the last one's end (now for one still running). ok is false when no
// step started.
func (g *Graph) Span() (start, end time.Time, ok bool) {
	for _, nd := range g.Nodes {
		for _, r := range []Run{nd.Do, nd.Undo} {
			for _, sp := range r.spans() {
				e := sp.End
				if e.IsZero() {
					e = g.Now
				}
				if !ok || sp.Start.Before(start) {
					start = sp.Start
				}
				if !ok || e.After(end) {
					end = e
				}
				ok = true
			}
		}
	}
	return start, end, ok
}

// TickStep is the tick interval for a time line of length d.
func TickStep(d time.Duration) time.Duration {
	for _, s := range tickSteps {
		if d/s < maxTicks {
			return s
		}
	}
	// Longer than the table reaches: spread maxTicks ticks (the loop
	// below stays bounded whatever the forged times).
	return d/maxTicks + 1
}

// Timeline draws the run's attempts on a time axis: a row per step (in
// level order), a bar per attempt of its work and of its rollback (the
// rollback's bars hatched, class fg-bar-undo), coloured by outcome, with
// tick labels measured from the first start. Each bar's <title> says
// which attempt it is, when and how it ended.
func (g *Graph) Timeline() string {
	order := g.Order()
	h := tlAxis + max(len(order), 1)*tlRow + 8
	w := tlLabel + tlChart + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="fg fg-timeline" id="flow-timeline-svg" role="img" aria-labelledby="fg-tl-title" viewBox="0 0 %d %d" width="%d" height="%d">`, w, h, w, h)
	start, end, ok := g.Span()
	if !ok {
		fmt.Fprintf(&b, `<title id="fg-tl-title">%s</title><text class="fg-meta" x="10" y="20">no step has started</text></svg>`,
			esc("Time line of flow "+g.Key+": no step has started"))
		return b.String()
	}
	total := end.Sub(start)
	if total <= 0 {
		total = time.Millisecond
	}
	fmt.Fprintf(&b, `<title id="fg-tl-title">%s</title>`, esc(fmt.Sprintf("Time line of flow %s: %s from %s",
		g.Key, orDash(Dur(total)), start.UTC().Format("2006-01-02 15:04:05Z"))))
	x := func(t time.Time) float64 {
		if t.IsZero() {
			t = g.Now
		}
		f := float64(t.Sub(start)) / float64(total)
		return float64(tlLabel) + max(0, min(1, f))*tlChart
	}
	// The axis: a tick and its offset from the start every step.
	step := TickStep(total)
	b.WriteString(`<g class="fg-axis">`)
	fmt.Fprintf(&b, `<text class="fg-axis-start" x="4" y="14">%s</text>`, esc("from "+start.UTC().Format("15:04:05Z")))
	for k := 0; k <= maxTicks+1; k++ {
		off := time.Duration(k) * step
		if off > total {
			break
		}
		tx := float64(tlLabel) + float64(off)/float64(total)*tlChart
		fmt.Fprintf(&b, `<line class="fg-tick" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/><text class="fg-tick-label" x="%.1f" y="14" text-anchor="middle">%s</text>`,
			tx, tlAxis-8, tx, h-4, tx, esc(tickLabel(off)))
	}
	b.WriteString(`</g>`)
	for row, i := range order {
		nd := g.Nodes[i]
		y := tlAxis + row*tlRow
		fmt.Fprintf(&b, `<g class="fg-row" data-step="%s"><text class="fg-row-name" x="4" y="%d">%s<title>%s</title></text>`,
			esc(nd.Name), y+tlBar-2, esc(cut(nd.Name, tlName)), esc(nd.Name))
		for _, r := range []struct {
			undo bool
			run  Run
		}{{false, nd.Do}, {true, nd.Undo}} {
			for _, sp := range r.run.spans() {
				x1, x2 := x(sp.Start), x(sp.End)
				class := "fg-bar fg-o-" + sp.Outcome
				what := "attempt"
				if r.undo {
					class += " fg-bar-undo"
					what = "rollback attempt"
				}
				title := fmt.Sprintf("%s %s %d: %s, %s", nd.Name, what, sp.Attempt, sp.Outcome, orDash(Dur(runTime(Run{Start: sp.Start, End: sp.End}, g.Now))))
				if sp.Error != "" {
					title += "\n" + sp.Error
				}
				fmt.Fprintf(&b, `<rect class="%s" x="%.1f" y="%d" width="%.1f" height="%d" rx="2"><title>%s</title></rect>`,
					esc(class), x1, y, max(x2-x1, 2), tlBar, esc(title))
			}
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// tickLabel is an offset on the axis: "0", "500ms", "1m30s".
func tickLabel(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
