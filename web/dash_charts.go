package web

// The dashboard's charts: SVG written on the server, inline in the page,
// no script and no library. Colours come from classes (style.css), so the
// dark theme recolours them and the content security policy, which allows
// no inline style, holds. Every figure a chart draws is also in its
// markup, as data- attributes and <title> tooltips, for readers and
// tests. Every text is escaped: kind names are anyone's.

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
)

// Chart geometry, in the viewBox's units; the chart scales to its box, so
// a chart's width is about its box's in pixels (text keeps its size).
const (
	padLeft   = 40
	padRight  = 8
	padTop    = 8
	padBottom = 20
)

// geom is a time chart's size in its viewBox.
type geom struct{ w, h int }

func (g geom) plotW() float64 { return float64(g.w - padLeft - padRight) }
func (g geom) plotH() float64 { return float64(g.h - padTop - padBottom) }

// The time charts' sizes: a grid cell's, and the full width's, whose text
// would otherwise be drawn twice as large.
var (
	smallChart = geom{400, 160}
	wideChart  = geom{wideW, 220}
)

// wideW is the width of the charts that take a page's full width.
const wideW = 1200

// svgBuf writes SVG markup.
type svgBuf struct{ strings.Builder }

func (b *svgBuf) f(format string, args ...any) { fmt.Fprintf(&b.Builder, format, args...) }

// esc escapes s for SVG text and attribute values, replacing what XML
// cannot carry at all.
func esc(s string) string {
	return template.HTMLEscapeString(xmlChars(s))
}

// xmlChars replaces the runes XML 1.0 does not allow in a document (and
// invalid UTF-8) with U+FFFD.
func xmlChars(s string) string {
	ok := func(r rune) bool {
		return r == 0x9 || r == 0xA || r == 0xD || (r >= 0x20 && r <= 0xD7FF) ||
			(r >= 0xE000 && r <= 0xFFFD) || (r >= 0x10000 && r <= 0x10FFFF)
	}
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !ok(r) }) < 0 {
		return s
	}
	var out strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || !ok(r) {
			r = '\uFFFD'
		}
		out.WriteRune(r)
	}
	return out.String()
}

// open starts an svg element with the chart's accessible name.
func (b *svgBuf) open(id, class, label string, w, h int) {
	b.f(`<svg xmlns="http://www.w3.org/2000/svg" class="chart %s" id="%s" viewBox="0 0 %d %d" role="img" aria-label="%s"`,
		esc(class), esc(id), w, h, esc(label))
}

// niceMax is the smallest 1, 2 or 5 times a power of ten that is at
// least n (1 for nothing), the top of a chart's axis.
func niceMax(n float64) float64 {
	if n <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(n)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= n {
			return m * p
		}
	}
	return 10 * p
}

// num formats an axis figure.
func num(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// axes draws the y axis from 0 to top (labelled by label) and the time
// axis under n buckets from start, step apart.
func (b *svgBuf) axes(g geom, top float64, label func(float64) string, start time.Time, step time.Duration, n int) {
	b.f(`<g class="axis">`)
	for _, frac := range []float64{0, 0.5, 1} {
		y := padTop + g.plotH() - frac*g.plotH()
		b.f(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" class="grid"/>`, padLeft, y, g.w-padRight, y)
		b.f(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padLeft-4, y+4, esc(label(frac*top)))
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if n < 2 && i > 0 {
			break
		}
		x := padLeft + (float64(i)+0.5)*g.plotW()/float64(n)
		anchor := "middle"
		switch i {
		case 0:
			anchor = "start"
		case n - 1:
			anchor = "end"
		}
		b.f(`<text x="%.1f" y="%d" text-anchor="%s">%s</text>`, x, g.h-5, anchor, start.Add(time.Duration(i)*step).UTC().Format("15:04"))
	}
	b.f(`</g>`)
}

// outcomeParts are the stacked parts of a throughput bar, bottom first.
var outcomeParts = []struct {
	class string
	n     func(stats.Counts) int64
}{
	{"succeeded", func(c stats.Counts) int64 { return c.Succeeded }},
	{"failed", func(c stats.Counts) int64 { return c.Failed }},
	{"retried", func(c stats.Counts) int64 { return c.Retried }},
	{"cancelled", func(c stats.Counts) int64 { return c.Cancelled + c.Expired }},
}

// countsAttrs are the data- attributes of c.
func countsAttrs(c stats.Counts) string {
	return fmt.Sprintf(`data-succeeded="%d" data-failed="%d" data-retried="%d" data-cancelled="%d" data-expired="%d"`,
		c.Succeeded, c.Failed, c.Retried, c.Cancelled, c.Expired)
}

// throughputChart draws the attempts of kind ("*": every kind) ended per
// bucket of s as stacked bars: succeeded, failed, retried, cancelled or
// expired. The svg element carries the series' totals.
func throughputChart(id, kind string, s stats.Series, g geom) template.HTML {
	counts := make([]stats.Counts, len(s.Buckets))
	var top int64
	for i, bk := range s.Buckets {
		if kind == "*" {
			counts[i] = bk.Sum()
		} else {
			counts[i] = bk.Kinds[kind]
		}
		top = max(top, counts[i].Total())
	}
	name := kind
	switch kind {
	case "*":
		name = "all kinds"
	case stats.OtherKinds:
		name = "other kinds"
	}
	total := s.Sum(kind)
	var b svgBuf
	b.open(id, "throughput", fmt.Sprintf("%s: %d succeeded, %d failed, %d retried, %d cancelled, %d expired",
		name, total.Succeeded, total.Failed, total.Retried, total.Cancelled, total.Expired), g.w, g.h)
	b.f(` data-kind="%s" data-step="%s" %s>`, esc(kind), s.Step, countsAttrs(total))
	b.f(`<title>%s</title>`, esc(name))
	if len(s.Buckets) == 0 {
		b.f(`</svg>`)
		return template.HTML(b.String())
	}
	ymax := niceMax(float64(top))
	b.axes(g, ymax, num, s.Buckets[0].Start, s.Step, len(s.Buckets))
	bw := g.plotW() / float64(len(s.Buckets))
	for i, c := range counts {
		if c.Total() == 0 {
			continue
		}
		start := s.Buckets[i].Start.UTC()
		b.f(`<g class="bucket" data-start="%s" %s>`, start.Format(time.RFC3339), countsAttrs(c))
		b.f(`<title>%s %s: %d succeeded, %d failed, %d retried, %d cancelled, %d expired</title>`, start.Format("15:04"),
			esc(name), c.Succeeded, c.Failed, c.Retried, c.Cancelled, c.Expired)
		x := padLeft + float64(i)*bw + bw*0.1
		y := padTop + g.plotH()
		for _, part := range outcomeParts {
			n := part.n(c)
			if n == 0 {
				continue
			}
			h := float64(n) / ymax * g.plotH()
			y -= h
			b.f(`<rect class="s-%s" x="%.2f" y="%.2f" width="%.2f" height="%.2f"/>`, part.class, x, y, bw*0.8, h)
		}
		b.f(`</g>`)
	}
	b.f(`</svg>`)
	return template.HTML(b.String())
}

// queueChart draws a queue figure (pending tasks, or the oldest ready
// task's wait in seconds) per bucket of s as a line, broken where a
// bucket has no sample.
func queueChart(id, what string, s stats.Series, value func(stats.Queue) float64, label func(float64) string) template.HTML {
	var top, last float64
	sampled := 0
	for _, bk := range s.Buckets {
		if bk.Queue != nil {
			v := value(*bk.Queue)
			top = max(top, v)
			last = v
			sampled++
		}
	}
	var b svgBuf
	g := smallChart
	b.open(id, "queue", what, g.w, g.h)
	b.f(` data-samples="%d" data-max="%s" data-last="%s">`, sampled, num(top), num(last))
	b.f(`<title>%s</title>`, esc(what))
	if len(s.Buckets) == 0 {
		b.f(`</svg>`)
		return template.HTML(b.String())
	}
	ymax := niceMax(top)
	b.axes(g, ymax, label, s.Buckets[0].Start, s.Step, len(s.Buckets))
	bw := g.plotW() / float64(len(s.Buckets))
	var path strings.Builder
	pen := "M"
	for i, bk := range s.Buckets {
		if bk.Queue == nil {
			pen = "M"
			continue
		}
		x := padLeft + (float64(i)+0.5)*bw
		y := padTop + g.plotH() - value(*bk.Queue)/ymax*g.plotH()
		fmt.Fprintf(&path, "%s%.2f %.2f ", pen, x, y)
		pen = "L"
	}
	if path.Len() > 0 {
		b.f(`<path class="line" d="%s"/>`, strings.TrimSpace(path.String()))
	}
	for i, bk := range s.Buckets {
		if bk.Queue == nil {
			continue
		}
		v := value(*bk.Queue)
		x := padLeft + (float64(i)+0.5)*bw
		y := padTop + g.plotH() - v/ymax*g.plotH()
		b.f(`<circle class="dot" cx="%.2f" cy="%.2f" r="2.5" data-value="%s"><title>%s %s: %s</title></circle>`,
			x, y, num(v), bk.Start.UTC().Format("15:04"), esc(what), esc(label(v)))
	}
	b.f(`</svg>`)
	return template.HTML(b.String())
}

// secondsLabel is a wait in seconds as a short duration.
func secondsLabel(v float64) string {
	return time.Duration(v * float64(time.Second)).Round(100 * time.Millisecond).String()
}

// timelineChart draws a task's attempts as bars on one time axis, the
// first attempt at the top: each from its start to its end (a running
// one to now, or to its lease's end when that has passed), coloured by
// how it ended.
func timelineChart(id string, rows []attemptRow, now time.Time) template.HTML {
	type span struct {
		row        attemptRow
		from, till time.Time
	}
	var spans []span
	var first, last time.Time
	for i := len(rows) - 1; i >= 0; i-- { // rows are newest first
		r := rows[i]
		from, till := r.Entry.StartedAt, r.Entry.EndedAt
		if from.IsZero() {
			continue
		}
		if till.IsZero() {
			till = now
			if r.Entry.State == task.AttemptRunning && r.Entry.LeaseUntil.Before(now) {
				till = r.Entry.LeaseUntil
			}
		}
		till = maxTime(till, from)
		spans = append(spans, span{r, from, till})
		if first.IsZero() || from.Before(first) {
			first = from
		}
		last = maxTime(last, till)
	}
	const rowH, labelW = 22, 160
	h := padTop + rowH*max(len(spans), 1) + padBottom
	var b svgBuf
	b.open(id, "timeline", fmt.Sprintf("%d attempts", len(spans)), wideW, h)
	b.f(` data-attempts="%d">`, len(spans))
	b.f(`<title>attempts</title>`)
	total := last.Sub(first)
	if total <= 0 {
		total = time.Millisecond
	}
	width := float64(wideW - labelW - padRight)
	for i, s := range spans {
		y := padTop + i*rowH
		x := labelW + float64(s.from.Sub(first))/float64(total)*width
		w := math.Max(float64(s.till.Sub(s.from))/float64(total)*width, 2)
		e := s.row.Entry
		b.f(`<g class="attempt" data-attempt="%d" data-outcome="%s" data-worker="%s">`, e.Attempt, esc(string(s.row.Shown)), esc(e.WorkerID))
		b.f(`<title>#%d %s: %s, %s to %s (%s)%s</title>`, e.Attempt, esc(e.WorkerID), esc(string(s.row.Shown)),
			s.from.UTC().Format("15:04:05.000"), s.till.UTC().Format("15:04:05.000"), s.till.Sub(s.from).Round(time.Millisecond), errNote(e.Error))
		b.f(`<text class="label" x="0" y="%d">#%d %s</text>`, y+15, e.Attempt, esc(clip(e.WorkerID, 20)))
		b.f(`<rect class="w-%s" x="%.2f" y="%d" width="%.2f" height="%d"/>`, esc(string(s.row.Shown)), x, y+3, w, rowH-6)
		b.f(`</g>`)
	}
	b.f(`<g class="axis"><text x="%d" y="%d">%s</text><text x="%d" y="%d" text-anchor="end">%s (%s)</text></g>`,
		labelW, h-5, first.UTC().Format("15:04:05"), wideW-padRight, h-5, last.UTC().Format("15:04:05"), total.Round(time.Millisecond))
	b.f(`</svg>`)
	return template.HTML(b.String())
}

func errNote(e string) string {
	if e == "" {
		return ""
	}
	return ": " + esc(clip(e, 200))
}

// clip cuts s to n runes, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// barItem is one labelled count of a bar list.
type barItem struct {
	Label string
	N     int
	Class string
}

// barList draws labelled counts as horizontal bars, largest scale first
// as given.
func barList(id, what string, items []barItem) template.HTML {
	const w, rowH, labelW = 400, 20, 130
	h := padTop + rowH*max(len(items), 1) + 4
	top := 0
	for _, it := range items {
		top = max(top, it.N)
	}
	var b svgBuf
	b.open(id, "bars", what, w, h)
	b.f(` data-items="%d">`, len(items))
	b.f(`<title>%s</title>`, esc(what))
	width := float64(w - labelW - 50)
	for i, it := range items {
		y := padTop + i*rowH
		bw := 0.0
		if top > 0 {
			bw = math.Max(float64(it.N)/float64(top)*width, 1)
		}
		class := it.Class
		if class == "" {
			class = "bar"
		}
		b.f(`<g class="item" data-label="%s" data-n="%d"><title>%s: %d</title>`, esc(it.Label), it.N, esc(it.Label), it.N)
		b.f(`<text class="label" x="0" y="%d">%s</text>`, y+14, esc(clip(it.Label, 18)))
		b.f(`<rect class="%s" x="%d" y="%d" width="%.2f" height="%d"/>`, esc(class), labelW, y+3, bw, rowH-6)
		b.f(`<text x="%.2f" y="%d">%d</text></g>`, float64(labelW)+bw+4, y+14, it.N)
	}
	b.f(`</svg>`)
	return template.HTML(b.String())
}

// waveBar is one wave as the rollout chart draws it.
type waveBar struct {
	Index int
	// Size is the wave's devices; the others count them by where they
	// stand (Failed: every failure kind; Other: cancelled or skipped).
	Size, Succeeded, Failed, Running, Queued, Other int
	Started, Ended                                  bool
	// State is the wave's (rollout.WaveState); empty: from Started and
	// Ended.
	State string
	// Gate is how the wave may start ("auto", "approval").
	Gate string
}

// rolloutBars is what the rollout chart draws.
type rolloutBars struct {
	Waves []waveBar
	// Current is the wave being run.
	Current int
	// AbortAt is the failure percentage (of ended executions) the
	// tightest abort rule aborts above, after AbortAfter ended; 0: none.
	AbortAt    float64
	AbortAfter int
	// Ended and Failures are the rollout's executions so far.
	Ended, Failures int
	// NextWave is the wave behind the next gate (-1: none), NextGate its
	// kind and GateState "closed", "waiting" or "open".
	NextWave            int
	NextGate, GateState string
}

// rolloutChart draws each wave as a bar filling with its devices'
// outcomes (failed from the left, then succeeded, running, queued), the
// abort threshold as a dashed line on every bar and on a bar of the
// failure rate so far, and the next wave's gate.
func rolloutChart(id string, r rolloutBars) template.HTML {
	const rowH, labelW, right = 34, 130, 290
	rows := len(r.Waves) + 1
	h := padTop + rowH*rows + 6
	width := float64(wideW - labelW - right)
	rate := 0.0
	if r.Ended > 0 {
		rate = 100 * float64(r.Failures) / float64(r.Ended)
	}
	var b svgBuf
	b.open(id, "rollout", fmt.Sprintf("%d waves, failure rate %.1f%%, abort above %.1f%%", len(r.Waves), rate, r.AbortAt), wideW, h)
	b.f(` data-waves="%d" data-abort-at="%s" data-failure-rate="%.1f" data-ended="%d" data-failures="%d">`,
		len(r.Waves), num(r.AbortAt), rate, r.Ended, r.Failures)
	b.f(`<title>waves</title>`)
	for i, w := range r.Waves {
		y := padTop + i*rowH
		state := "waiting"
		switch {
		case w.State != "" && w.State != string(rollout.WavePending):
			state = w.State // aborted, cancelled or skipped besides
		case w.Ended:
			state = "ended"
		case w.Started:
			state = "running"
		}
		b.f(`<g class="wave" data-wave="%d" data-state="%s" data-size="%d" data-succeeded="%d" data-failed="%d" data-running="%d" data-queued="%d">`,
			w.Index+1, state, w.Size, w.Succeeded, w.Failed, w.Running, w.Queued)
		b.f(`<title>wave %d (%s, gate %s): %d devices, %d succeeded, %d failed, %d running, %d queued</title>`,
			w.Index+1, state, esc(w.Gate), w.Size, w.Succeeded, w.Failed, w.Running, w.Queued)
		b.f(`<text class="label" x="0" y="%d">wave %d</text><text x="0" y="%d">%d devices</text>`, y+12, w.Index+1, y+25, w.Size)
		x := float64(labelW)
		for _, part := range []struct {
			class string
			n     int
		}{{"r-failed", w.Failed}, {"r-succeeded", w.Succeeded}, {"r-running", w.Running}, {"r-pending", w.Queued + w.Other}} {
			if part.n == 0 || w.Size == 0 {
				continue
			}
			pw := float64(part.n) / float64(w.Size) * width
			b.f(`<rect class="%s" x="%.2f" y="%d" width="%.2f" height="%d"/>`, part.class, x, y+4, pw, rowH-12)
			x += pw
		}
		b.f(`<rect class="r-frame" x="%d" y="%d" width="%.2f" height="%d"/>`, labelW, y+4, width, rowH-12)
		if r.AbortAt > 0 {
			tx := float64(labelW) + math.Min(r.AbortAt, 100)/100*width
			b.f(`<line class="threshold" x1="%.2f" y1="%d" x2="%.2f" y2="%d"/>`, tx, y+1, tx, y+rowH-5)
		}
		b.f(`<text x="%.2f" y="%d">%d ok, %d failed</text>`, float64(labelW)+width+6, y+12, w.Succeeded, w.Failed)
		if i == r.NextWave {
			b.f(`<text class="gate" x="%.2f" y="%d" data-gate="%s" data-gate-state="%s">gate: %s, %s</text>`,
				float64(labelW)+width+6, y+25, esc(r.NextGate), esc(r.GateState), esc(r.NextGate), esc(r.GateState))
		} else if i == r.Current && w.Started && !w.Ended {
			b.f(`<text x="%.2f" y="%d">running</text>`, float64(labelW)+width+6, y+25)
		}
		b.f(`</g>`)
	}
	// The failure rate so far against the threshold, on a scale that
	// shows both.
	y := padTop + len(r.Waves)*rowH
	scale := math.Max(niceMax(math.Max(r.AbortAt*2, rate)), 10)
	b.f(`<g class="rate" data-rate="%.1f"><title>failure rate %.1f%% of %d ended; abort above %s%% after %d</title>`,
		rate, rate, r.Ended, num(r.AbortAt), r.AbortAfter)
	b.f(`<text class="label" x="0" y="%d">failure rate</text><text x="0" y="%d">%d of %d ended</text>`, y+12, y+25, r.Failures, r.Ended)
	b.f(`<rect class="r-frame" x="%d" y="%d" width="%.2f" height="%d"/>`, labelW, y+4, width, rowH-12)
	if rate > 0 {
		b.f(`<rect class="r-failed" x="%d" y="%d" width="%.2f" height="%d"/>`, labelW, y+4, math.Min(rate/scale, 1)*width, rowH-12)
	}
	if r.AbortAt > 0 {
		tx := float64(labelW) + math.Min(r.AbortAt/scale, 1)*width
		b.f(`<line class="threshold" x1="%.2f" y1="%d" x2="%.2f" y2="%d"/>`, tx, y+1, tx, y+rowH-5)
		b.f(`<text class="threshold-label" x="%.2f" y="%d">abort above %s%% (after %d)</text>`, float64(labelW)+width+6, y+12, num(r.AbortAt), r.AbortAfter)
	}
	b.f(`<text x="%.2f" y="%d">%.1f%% (scale 0–%s%%)</text>`, float64(labelW)+width+6, y+25, rate, num(scale))
	b.f(`</g></svg>`)
	return template.HTML(b.String())
}
