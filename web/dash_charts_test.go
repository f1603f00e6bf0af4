package web

import (
	"encoding/xml"
	"errors"
	"html/template"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/task"
)

// element is one parsed SVG element: its name, attributes and text.
type element struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG parses an SVG chart as strict XML, failing t if it is not
// well-formed, and returns its elements in document order.
func parseSVG(t *testing.T, h template.HTML) []element {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(string(h)))
	dec.Strict = true
	var out []element
	var open []int
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, h)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			e := element{name: tk.Name.Local, attrs: map[string]string{}}
			for _, a := range tk.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
			open = append(open, len(out)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 {
				out[open[len(open)-1]].text += string(tk)
			}
		}
	}
	if len(out) == 0 || out[0].name != "svg" {
		t.Fatalf("no svg element:\n%s", h)
	}
	return out
}

func find(els []element, name, class string) []element {
	var out []element
	for _, e := range els {
		if e.name == name && (class == "" || e.attrs["class"] == class) {
			out = append(out, e)
		}
	}
	return out
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// hostile are kind names anyone may publish; every one must come out as
// text, never as markup, and keep the chart well-formed.
var hostile = []string{
	`<script>alert(1)</script>`, `"><svg onload=alert(1)>`, `a&b;&amp;`, `it's "quoted"`, "\uFFFE\uFFFF non-XML",
	"bad utf8 \xff\xfe", `]]><![CDATA[x`, "<!-- c -->",
}

func series(start time.Time, n int, fill map[int]map[string]stats.Counts) stats.Series {
	s := stats.Series{Step: time.Minute}
	for i := range n {
		b := stats.Bucket{Start: start.Add(time.Duration(i) * time.Minute), Kinds: fill[i]}
		if i%3 == 0 {
			b.Queue = &stats.Queue{Pending: int64(i), OldestReady: task.Duration(time.Duration(i) * time.Second)}
		}
		s.Buckets = append(s.Buckets, b)
	}
	return s
}

func TestThroughputChartEscapesAndCounts(t *testing.T) {
	start := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	fill := map[int]map[string]stats.Counts{}
	for i, kind := range hostile {
		fill[i*3] = map[string]stats.Counts{kind: {Succeeded: int64(i + 1), Failed: 2, Retried: 1, Expired: 1}, "plain": {Succeeded: 5}}
	}
	s := series(start, 60, fill)
	for _, kind := range append([]string{"*"}, hostile...) {
		h := throughputChart("c", kind, s, smallChart)
		for _, bad := range []string{"<script", "<svg onload", "<!--", "<![CDATA["} {
			if strings.Contains(string(h), bad) {
				t.Errorf("kind %q: the chart carries %s unescaped", kind, bad)
			}
		}
		els := parseSVG(t, h)
		root := els[0]
		want := s.Sum(kind)
		if kind != "*" && root.attrs["data-kind"] != xmlChars(kind) {
			t.Errorf("data-kind %q, want %q", root.attrs["data-kind"], xmlChars(kind))
		}
		got := stats.Counts{Succeeded: atoi(t, root.attrs["data-succeeded"]), Failed: atoi(t, root.attrs["data-failed"]),
			Retried: atoi(t, root.attrs["data-retried"]), Cancelled: atoi(t, root.attrs["data-cancelled"]), Expired: atoi(t, root.attrs["data-expired"])}
		if got != want {
			t.Errorf("kind %q: totals %+v, want %+v", kind, got, want)
		}
		// One bar per bucket with attempts, its parts summing to its count.
		var perBucket int64
		for _, g := range find(els, "g", "bucket") {
			perBucket += atoi(t, g.attrs["data-succeeded"])
		}
		if perBucket != want.Succeeded {
			t.Errorf("kind %q: buckets sum to %d succeeded, want %d", kind, perBucket, want.Succeeded)
		}
	}
	// The bars' heights are to scale: the tallest bucket of "*" is the
	// one with the most attempts.
	els := parseSVG(t, throughputChart("c", "*", s, wideChart))
	rects := find(els, "rect", "s-succeeded")
	if len(rects) != len(hostile) {
		t.Fatalf("%d succeeded bars, want %d", len(rects), len(hostile))
	}
	h0, _ := strconv.ParseFloat(rects[0].attrs["height"], 64)
	hn, _ := strconv.ParseFloat(rects[len(rects)-1].attrs["height"], 64)
	if ratio := hn / h0; ratio < 2.1 || ratio > 2.25 { // (5+8) / (5+1) succeeded
		t.Errorf("bar heights %v and %v: ratio %.2f, want 13/6", h0, hn, ratio)
	}
}

func TestQueueChart(t *testing.T) {
	s := series(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC), 10, nil)
	els := parseSVG(t, queueChart("q", `pending <b>`, s, func(q stats.Queue) float64 { return float64(q.Pending) }, num))
	if got := els[0].attrs["data-samples"]; got != "4" { // buckets 0, 3, 6, 9
		t.Errorf("samples %s, want 4", got)
	}
	if got := els[0].attrs["data-max"]; got != "9" {
		t.Errorf("max %s, want 9", got)
	}
	path := find(els, "path", "line")
	if len(path) != 1 || strings.Count(path[0].attrs["d"], "M") != 4 {
		t.Errorf("path %v: want one line broken at each gap (4 moves)", path)
	}
	if dots := find(els, "circle", "dot"); len(dots) != 4 || dots[3].attrs["data-value"] != "9" {
		t.Errorf("dots %v", dots)
	}
	parseSVG(t, queueChart("q", "empty", stats.Series{Step: time.Minute}, func(stats.Queue) float64 { return 0 }, num))
}

func TestTimelineChart(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Second)
	rows := []attemptRow{ // newest first, as the task page has them
		{Entry: task.Attempt{WorkerID: "w<2>", Attempt: 3, State: task.AttemptRunning, StartedAt: t0.Add(6 * time.Second), LeaseUntil: now.Add(time.Minute)}, Shown: task.AttemptRunning},
		{Entry: task.Attempt{WorkerID: "w1", Attempt: 2, State: task.AttemptRunning, StartedAt: t0.Add(2 * time.Second), LeaseUntil: t0.Add(5 * time.Second)}, Shown: task.AttemptExpired},
		{Entry: task.Attempt{WorkerID: "w1", Attempt: 1, State: task.AttemptFail, StartedAt: t0, EndedAt: t0.Add(time.Second), Error: "boom & <bust>"}, Shown: task.AttemptFail},
	}
	els := parseSVG(t, timelineChart("tl", rows, now))
	att := find(els, "g", "attempt")
	if len(att) != 3 {
		t.Fatalf("%d attempts drawn, want 3", len(att))
	}
	for i, want := range []string{"1", "2", "3"} { // oldest at the top
		if att[i].attrs["data-attempt"] != want {
			t.Errorf("row %d is attempt %s, want %s", i, att[i].attrs["data-attempt"], want)
		}
	}
	if att[2].attrs["data-worker"] != "w<2>" || att[1].attrs["data-outcome"] != "EXPIRED" {
		t.Errorf("attrs %v %v", att[2].attrs, att[1].attrs)
	}
	titles := find(els, "title", "")
	if !strings.Contains(titles[1].text, "boom & <bust>") {
		t.Errorf("the failed attempt's title %q lacks its error", titles[1].text)
	}
	// The expired attempt ends at its lease's end, the running one at now:
	// the last bar reaches the right edge.
	bars := find(els, "rect", "w-RUNNING")
	x, _ := strconv.ParseFloat(bars[0].attrs["x"], 64)
	w, _ := strconv.ParseFloat(bars[0].attrs["width"], 64)
	if end := x + w; end < wideW-padRight-1 || end > wideW-padRight+1 {
		t.Errorf("the running attempt ends at x=%.1f, want the right edge %d", end, wideW-padRight)
	}
	parseSVG(t, timelineChart("tl", nil, now))
}

func TestBarListAndRolloutChart(t *testing.T) {
	items := topValues(map[string]int{"pump-x": 10, "<b>": 3, "valve": 7})
	els := parseSVG(t, barList("b", "by model", items))
	got := find(els, "g", "item")
	if len(got) != 3 || got[0].attrs["data-label"] != "pump-x" || got[1].attrs["data-n"] != "7" || got[2].attrs["data-label"] != "<b>" {
		t.Errorf("items %v", got)
	}
	many := map[string]int{}
	for i := range 30 {
		many["v"+strconv.Itoa(i)] = 1
	}
	if top := topValues(many); len(top) != maxAttributeValues || top[len(top)-1].N != 30-maxAttributeValues+1 {
		t.Errorf("top values %v: want %d with the rest summed", top, maxAttributeValues)
	}

	r := rolloutBars{Waves: []waveBar{
		{Index: 0, Size: 1, Succeeded: 1, Started: true, Ended: true, Gate: "auto"},
		{Index: 1, Size: 19, Succeeded: 10, Failed: 3, Running: 4, Queued: 2, Started: true, Gate: "auto"},
		{Index: 2, Size: 80, Queued: 80, Gate: `approval"<x>`},
	}, Current: 1, AbortAt: 8, AbortAfter: 20, Ended: 14, Failures: 3, NextWave: 2, NextGate: `approval"<x>`, GateState: "closed"}
	els = parseSVG(t, rolloutChart("ro", r))
	if els[0].attrs["data-failure-rate"] != "21.4" || els[0].attrs["data-abort-at"] != "8" {
		t.Errorf("root %v", els[0].attrs)
	}
	waves := find(els, "g", "wave")
	if len(waves) != 3 || waves[1].attrs["data-state"] != "running" || waves[1].attrs["data-failed"] != "3" || waves[2].attrs["data-state"] != "waiting" {
		t.Errorf("waves %v", waves)
	}
	if n := len(find(els, "line", "threshold")); n != 4 {
		t.Errorf("%d threshold lines, want one per wave and one on the rate", n)
	}
	gate := find(els, "text", "gate")
	if len(gate) != 1 || gate[0].attrs["data-gate"] != `approval"<x>` || gate[0].attrs["data-gate-state"] != "closed" {
		t.Errorf("gate %v", gate)
	}
	// The wave's parts fill its frame in proportion.
	var filled float64
	for _, class := range []string{"r-failed", "r-succeeded", "r-running", "r-pending"} {
		for _, rc := range find(els, "rect", class) {
			if rc.attrs["y"] == find(els, "rect", "r-frame")[1].attrs["y"] {
				w, _ := strconv.ParseFloat(rc.attrs["width"], 64)
				filled += w
			}
		}
	}
	frame, _ := strconv.ParseFloat(find(els, "rect", "r-frame")[1].attrs["width"], 64)
	if filled < frame-0.1 || filled > frame+0.1 {
		t.Errorf("wave 2's parts fill %.2f of %.2f", filled, frame)
	}
}

func TestNiceMax(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 1: 1, 3: 5, 7: 10, 12: 20, 150: 200, 999: 1000, 1001: 2000} {
		if got := niceMax(in); got != want {
			t.Errorf("niceMax(%v) = %v, want %v", in, got, want)
		}
	}
}
