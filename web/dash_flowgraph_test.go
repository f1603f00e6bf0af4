package web_test

// The flow page's picture over HTTP: hostile step names stay text, both
// SVGs parse as XML, the DAG's edges and levels are the flow's.

import (
	"encoding/xml"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/web"
)

// svgs are the inline SVG documents of a page.
var svgs = regexp.MustCompile(`(?s)<svg xmlns=.*?</svg>`)

func parseSVG(t *testing.T, s string) map[string]int {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(s))
	dec.Strict = true
	elements := map[string]int{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return elements
		}
		if err != nil {
			t.Fatalf("SVG not well-formed: %v\n%s", err, s)
		}
		if se, ok := tok.(xml.StartElement); ok {
			elements[se.Name.Local]++
			for _, a := range se.Attr {
				if strings.HasPrefix(strings.ToLower(a.Name.Local), "on") {
					t.Errorf("attribute %s in the SVG", a.Name.Local)
				}
			}
		}
	}
}

func TestFlowPagePicture(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	// Names publish accepts that a page could trip on: markup, entities,
	// quotes, a right-to-left override, the longest name allowed.
	script, amp, quote, rtl := `<script>alert(1)</script>`, `a&b&amp;c`, `"q'`, "\u202Egnp.exe"
	long := strings.Repeat("w", flow.MaxNameLen)
	spec := flow.Spec{Key: `k<&>"`, Steps: []flow.Step{
		{Name: script, Action: flow.Action{Kind: "noop"}},
		{Name: amp, Needs: []string{script}, Action: flow.Action{Kind: "noop"}, Rollback: &flow.Action{Kind: "noop"}},
		{Name: quote, Needs: []string{script}, Action: flow.Action{Kind: "noop"}},
		{Name: rtl, Type: flow.TypeSignal, Needs: []string{amp, quote}},
		{Name: long, Needs: []string{rtl, script}, Action: flow.Action{Kind: "noop"}},
	}}
	if _, _, err := flow.Publish(t.Context(), e.store, spec); err != nil {
		t.Fatal(err)
	}
	body := e.wantPage("/flow?key=k%3C%26%3E%22", 200, `id="flow-graph"`, `id="flow-timeline"`, `class="fg-legend"`)
	if strings.Contains(body, "<script>alert") {
		t.Errorf("a step name reached the page unescaped:\n%s", body)
	}
	// Outside the drawings the names are isolated (<bdi>), so an override
	// turns nothing after them around.
	if !strings.Contains(body, "<td><bdi>\u202Egnp.exe</bdi></td>") {
		t.Errorf("the steps table does not isolate the right-to-left name")
	}
	found := svgs.FindAllString(body, -1)
	if len(found) != 2 {
		t.Fatalf("%d SVGs on the page, want the DAG and the time line", len(found))
	}
	dag := parseSVG(t, found[0])
	parseSVG(t, found[1])
	for _, svg := range found {
		if strings.Contains(svg, "\u202E") {
			t.Errorf("a right-to-left override in an SVG")
		}
	}
	if dag["script"] > 0 || dag["svg"] != 1 {
		t.Errorf("elements of the DAG: %v", dag)
	}
	// 5 steps, 6 needs; the boxes are in level order: the first step
	// alone, then its two dependants, the signal step, the last one.
	if n := strings.Count(found[0], `class="fg-edge"`); n != 6 {
		t.Errorf("%d edges, want 6", n)
	}
	steps := regexp.MustCompile(`data-step="([^"]*)" data-state="([a-z_]+)"`).FindAllStringSubmatch(found[0], -1)
	if len(steps) != 5 {
		t.Fatalf("%d step boxes, want 5", len(steps))
	}
	if steps[0][1] != "&lt;script&gt;alert(1)&lt;/script&gt;" || steps[1][1] != "a&amp;b&amp;amp;c" || steps[2][1] != "&#34;q&#39;" ||
		steps[3][1] != "\uFFFDgnp.exe" || steps[4][1] != long {
		t.Errorf("step names as drawn: %q", steps)
	}
	if steps[0][2] != "running" || steps[3][2] != "waiting" {
		t.Errorf("states as drawn: %q", steps)
	}
	for _, want := range []string{`translate(20,20)`, `translate(280,20)`, `translate(280,92)`, `translate(540,20)`, `translate(800,20)`} {
		if !strings.Contains(found[0], want) {
			t.Errorf("the DAG lacks a box at %s: levels or rows are off", want)
		}
	}
	if !strings.Contains(found[0], "wwwwwwwwwwwwwwwwwwwwwwww…") {
		t.Errorf("the longest name is not cut to fit its box")
	}
}
