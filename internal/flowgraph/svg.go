package flowgraph

import (
	"fmt"
	"html"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The DAG's geometry, in SVG user units (pixels at scale 1).
const (
	boxW   = 196
	boxH   = 50
	gapX   = 64
	gapY   = 22
	pad    = 20
	nameAt = 25 // runes of a name shown in a box; the <title> has it all
)

// SVG draws the DAG: a box per step, coloured by its state through CSS
// classes (fg-s-STATE; the page's style sheet holds the colours, so a
// dark theme changes them), an arrow per need, and, when the rollback
// ran, dashed arrows from each rolled-back step to the next one in
// rollback order with the order numbered. Every name is escaped and cut
// to fit; the full name, state, attempts and times are in each box's
// <title> (the browser shows it on hover).
func (g *Graph) SVG() string {
	levels, rows := max(len(g.Levels), 1), max(g.MaxRows(), 1)
	w := 2*pad + levels*boxW + (levels-1)*gapX
	h := 2*pad + rows*boxH + (rows-1)*gapY + 16 // room for the rollback arcs
	// Up to about six levels the page may shrink the drawing to its
	// width (class fg-fit); a wider one scrolls, its text kept legible.
	class := "fg fg-dag"
	if levels <= 6 {
		class += " fg-fit"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="%s" id="flow-graph-svg" role="img" aria-labelledby="fg-title" viewBox="0 0 %d %d" width="%d" height="%d">`, class, w, h, w, h)
	fmt.Fprintf(&b, `<title id="fg-title">%s</title>`, esc(fmt.Sprintf("Steps of flow %s: %d steps in %d levels", g.Key, len(g.Nodes), len(g.Levels))))
	b.WriteString(`<defs>` +
		`<marker id="fg-arrow" class="fg-arrowhead" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z"/></marker>` +
		`<marker id="fg-rb-arrow" class="fg-rb-arrowhead" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z"/></marker>` +
		`</defs>`)
	b.WriteString(`<g class="fg-edges">`)
	for _, e := range g.Edges {
		x1, y1 := g.boxAt(e.From)
		x2, y2 := g.boxAt(e.To)
		x1, y1, y2 = x1+boxW, y1+boxH/2, y2+boxH/2
		mid := float64(x1+x2) / 2
		if x2 <= x1 { // a forged back edge: bend out below the boxes
			mid = float64(x1 + gapX/2)
		}
		fmt.Fprintf(&b, `<path class="fg-edge" d="M%d,%d C%.1f,%d %.1f,%d %d,%d" marker-end="url(#fg-arrow)"><title>%s</title></path>`,
			x1, y1, mid, y1, mid, y2, x2, y2, esc(g.Nodes[e.To].Name+" needs "+g.Nodes[e.From].Name))
	}
	b.WriteString(`</g><g class="fg-rollback">`)
	for k := 1; k < len(g.Rollback); k++ {
		from, to := g.Rollback[k-1], g.Rollback[k]
		x1, y1 := g.boxAt(from)
		x2, y2 := g.boxAt(to)
		// From the top of one box over to the top of the next, arched
		// above both, so the path reads apart from the needs' arrows.
		cx1, cx2 := x1+boxW/3, x2+2*boxW/3
		top := min(y1, y2) - pad + 2
		fmt.Fprintf(&b, `<path class="fg-rb-edge" d="M%d,%d C%d,%d %d,%d %d,%d" marker-end="url(#fg-rb-arrow)"><title>%s</title></path>`,
			cx1, y1, cx1, top, cx2, top, cx2, y2, esc(fmt.Sprintf("rollback %d: %s, then %d: %s", k, g.Nodes[from].Name, k+1, g.Nodes[to].Name)))
	}
	b.WriteString(`</g><g class="fg-nodes">`)
	for i, nd := range g.Nodes {
		x, y := g.boxAt(i)
		fmt.Fprintf(&b, `<g class="fg-node fg-s-%s" id="fg-node-%d" data-step="%s" data-state="%s" data-attempts="%d" transform="translate(%d,%d)">`,
			esc(string(nd.State)), i, esc(nd.Name), esc(string(nd.State)), nd.Do.Attempts, x, y)
		fmt.Fprintf(&b, `<title>%s</title>`, esc(nd.describe(g.Now)))
		fmt.Fprintf(&b, `<rect class="fg-box" width="%d" height="%d" rx="6"/>`, boxW, boxH)
		fmt.Fprintf(&b, `<text class="fg-name" x="10" y="20">%s</text>`, esc(cut(nd.Name, nameAt)))
		fmt.Fprintf(&b, `<text class="fg-meta" x="10" y="39">%s</text>`, esc(nd.meta(g.Now)))
		if nd.RollbackN > 0 {
			fmt.Fprintf(&b, `<g class="fg-rb-badge"><circle cx="%d" cy="0" r="9"/><text x="%d" y="4" text-anchor="middle">%d</text></g>`,
				boxW-12, boxW-12, nd.RollbackN)
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</g></svg>`)
	return b.String()
}

// boxAt is the top left corner of node i's box.
func (g *Graph) boxAt(i int) (x, y int) {
	nd := g.Nodes[i]
	return pad + nd.Level*(boxW+gapX), pad + nd.Row*(boxH+gapY)
}

// meta is the line under a step's name: state, attempts, time taken.
func (nd Node) meta(now time.Time) string {
	s := strings.ReplaceAll(string(nd.State), "_", " ")
	if a := nd.Do.Attempts; a > 1 {
		s += fmt.Sprintf(" · %d attempts", a)
	}
	if d := runTime(nd.Do, now); d > 0 {
		s += " · " + Dur(d)
	}
	return s
}

// describe is a step's hover text.
func (nd Node) describe(now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s", nd.Name, nd.Type)
	if nd.Kind != "" {
		fmt.Fprintf(&b, ", kind %s", nd.Kind)
	}
	fmt.Fprintf(&b, "): %s", strings.ReplaceAll(string(nd.State), "_", " "))
	if len(nd.Needs) > 0 {
		fmt.Fprintf(&b, "\nneeds %s", strings.Join(nd.Needs, ", "))
	}
	if nd.MaxFailedNeeds > 0 {
		fmt.Fprintf(&b, " (max_failed_needs %d)", nd.MaxFailedNeeds)
	}
	if nd.State == Skipped && nd.Reason != "" {
		fmt.Fprintf(&b, "\nskipped: %s", nd.Reason)
	}
	for _, r := range []struct {
		what string
		run  Run
	}{{"do", nd.Do}, {"undo", nd.Undo}} {
		if r.run.Start.IsZero() {
			continue
		}
		fmt.Fprintf(&b, "\n%s: %s, %s, started %s", r.what, plural(r.run.Attempts, "attempt"), orDash(Dur(runTime(r.run, now))),
			r.run.Start.UTC().Format("15:04:05.000"))
		if !r.run.End.IsZero() {
			fmt.Fprintf(&b, ", ended %s", r.run.End.UTC().Format("15:04:05.000"))
		} else if !r.run.Due.IsZero() {
			fmt.Fprintf(&b, ", due %s", r.run.Due.UTC().Format("15:04:05.000"))
		}
		if r.run.Error != "" {
			fmt.Fprintf(&b, "\n%s error: %s", r.what, r.run.Error)
		}
	}
	if nd.RollbackN > 0 {
		fmt.Fprintf(&b, "\nrolled back %s", ordinal(nd.RollbackN))
	}
	return b.String()
}

// runTime is how long r took, or has run until now.
func runTime(r Run, now time.Time) time.Duration {
	if r.Start.IsZero() {
		return 0
	}
	end := r.End
	if end.IsZero() {
		end = now
	}
	if end.Before(r.Start) {
		return 0
	}
	return end.Sub(r.Start)
}

// Dur is d for reading: milliseconds under 10 s, whole seconds above.
func Dur(d time.Duration) string {
	switch {
	case d <= 0:
		return ""
	case d < 10*time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

// Clean makes s safe to show: invalid UTF-8, control characters and the
// bidirectional controls (which could turn the text around it, and what
// follows, right to left) become U+FFFD; newlines stay.
func Clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' {
			return r // the hover text's lines
		}
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == 0xFFFE || r == 0xFFFF {
			return '\uFFFD'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// esc is s cleaned and escaped for XML text and attribute values.
func esc(s string) string { return html.EscapeString(Clean(s)) }

// cut shortens s to n runes, ending it with an ellipsis when cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
