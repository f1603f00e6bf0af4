package flowgraph

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)

// graph builds a graph of steps "name:need,need".
func graph(specs ...string) *Graph {
	g := &Graph{Key: "f", Now: t0.Add(time.Minute)}
	for _, s := range specs {
		name, needs, _ := strings.Cut(s, ":")
		nd := Node{Name: name, Type: "task", State: Waiting}
		if needs != "" {
			nd.Needs = strings.Split(needs, ",")
		}
		g.Nodes = append(g.Nodes, nd)
	}
	g.Layout()
	return g
}

func levelNames(g *Graph) [][]string {
	var out [][]string
	for _, l := range g.Levels {
		var names []string
		for _, i := range l {
			names = append(names, g.Nodes[i].Name)
		}
		out = append(out, names)
	}
	return out
}

func TestLayoutLevelsAreLongestPaths(t *testing.T) {
	for _, c := range []struct {
		specs []string
		want  [][]string
		edges []Edge
	}{
		{[]string{"a", "b:a", "c:a", "d:b,c"}, [][]string{{"a"}, {"b", "c"}, {"d"}},
			[]Edge{{0, 1}, {0, 2}, {1, 3}, {2, 3}}},
		// d needs a and c: its level is c's + 1, not a's + 1.
		{[]string{"a", "b:a", "c:b", "d:a,c"}, [][]string{{"a"}, {"b"}, {"c"}, {"d"}},
			[]Edge{{0, 1}, {1, 2}, {0, 3}, {2, 3}}},
		// Two roots; a step listed before what it needs keeps step order
		// inside its level.
		{[]string{"z:y", "y", "x", "w:x,y"}, [][]string{{"y", "x"}, {"z", "w"}},
			[]Edge{{1, 0}, {2, 3}, {1, 3}}},
		// A need named twice is one edge.
		{[]string{"a", "b:a,a"}, [][]string{{"a"}, {"b"}}, []Edge{{0, 1}}},
	} {
		g := graph(c.specs...)
		if got := levelNames(g); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v: levels %v, want %v", c.specs, got, c.want)
		}
		if !reflect.DeepEqual(g.Edges, c.edges) {
			t.Errorf("%v: edges %v, want %v", c.specs, g.Edges, c.edges)
		}
		if len(g.Cyclic) > 0 || len(g.Unknown) > 0 {
			t.Errorf("%v: cyclic %v unknown %v, want none", c.specs, g.Cyclic, g.Unknown)
		}
		for l, idx := range g.Levels {
			for r, i := range idx {
				if g.Nodes[i].Level != l || g.Nodes[i].Row != r {
					t.Errorf("%v: node %s at %d/%d, listed at %d/%d", c.specs, g.Nodes[i].Name, g.Nodes[i].Level, g.Nodes[i].Row, l, r)
				}
			}
		}
	}
}

// A forged document (publish refuses all of these) still lays out, in
// bounded time, and says what is wrong.
func TestLayoutOfForgedDocuments(t *testing.T) {
	done := make(chan *Graph)
	go func() {
		done <- graph("root", "a:c", "b:a", "c:b", "self:self", "after:a", "ghost:nobody", "root")
	}()
	var g *Graph
	select {
	case g = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("layout of a cyclic document did not end")
	}
	if want := []string{"a", "b", "c", "self", "after"}; !reflect.DeepEqual(g.Cyclic, want) {
		t.Errorf("cyclic %v, want %v", g.Cyclic, want)
	}
	if want := []string{"ghost: nobody"}; !reflect.DeepEqual(g.Unknown, want) {
		t.Errorf("unknown %v, want %v", g.Unknown, want)
	}
	// The cycle is drawn in one level after the rest; the second "root"
	// has no edges in.
	if got := levelNames(g); !reflect.DeepEqual(got, [][]string{{"root", "ghost", "root"}, {"a", "b", "c", "self", "after"}}) {
		t.Errorf("levels %v", got)
	}
	wellFormed(t, g.SVG())
	wellFormed(t, g.Timeline())
	var out bytes.Buffer
	if err := g.Text(&out, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "cycle of needs (drawn last): a, b, c, self, after") ||
		!strings.Contains(out.String(), "needs of no step: ghost: nobody") {
		t.Errorf("text:\n%s", out.String())
	}
}

func TestLayoutIsLinear(t *testing.T) {
	// 20,000 steps each needing every one of the 5 before: a quadratic
	// layout would take minutes.
	specs := make([]string, 20000)
	for i := range specs {
		var needs []string
		for k := max(0, i-5); k < i; k++ {
			needs = append(needs, fmt.Sprint(k))
		}
		specs[i] = fmt.Sprint(i) + ":" + strings.Join(needs, ",")
	}
	start := time.Now()
	g := graph(specs...)
	if len(g.Levels) != len(specs) || g.Nodes[len(specs)-1].Level != len(specs)-1 {
		t.Fatalf("%d levels, last at %d", len(g.Levels), g.Nodes[len(specs)-1].Level)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("layout of %d steps took %v", len(specs), d)
	}
}

func TestRollbackOrder(t *testing.T) {
	g := graph("a", "b:a", "c:a", "d:b,c")
	set := func(i int, start time.Duration, state string) {
		g.Nodes[i].HasRollback = true
		g.Nodes[i].Undo = Run{State: state, Start: t0.Add(start), End: t0.Add(start + time.Second), Attempts: 1}
	}
	// c and b were undone together (b, the later step, first), then a.
	set(2, 5*time.Second, "succeeded")
	set(1, 5*time.Second, "succeeded")
	set(0, 7*time.Second, "succeeded")
	g.Layout()
	var names []string
	for _, i := range g.Rollback {
		names = append(names, g.Nodes[i].Name)
	}
	if want := []string{"c", "b", "a"}; !reflect.DeepEqual(names, want) {
		t.Errorf("rollback order %v, want %v", names, want)
	}
	if g.Nodes[2].RollbackN != 1 || g.Nodes[1].RollbackN != 2 || g.Nodes[0].RollbackN != 3 || g.Nodes[3].RollbackN != 0 {
		t.Errorf("rollback numbers %d %d %d %d", g.Nodes[0].RollbackN, g.Nodes[1].RollbackN, g.Nodes[2].RollbackN, g.Nodes[3].RollbackN)
	}
	svg := g.SVG()
	doc := wellFormed(t, svg)
	if n := strings.Count(svg, `class="fg-rb-edge"`); n != 2 {
		t.Errorf("%d rollback arrows, want 2", n)
	}
	if got := doc.badges(); !reflect.DeepEqual(got, []string{"3", "2", "1"}) {
		t.Errorf("rollback badges in step order %v, want 3 2 1", got)
	}
	var out bytes.Buffer
	_ = g.Text(&out, false)
	if !strings.Contains(out.String(), "rollback order: 1 c, 2 b, 3 a") {
		t.Errorf("text:\n%s", out.String())
	}
}

// svgDoc is what wellFormed read of an SVG.
type svgDoc struct {
	elements map[string]int
	// texts are the character data of each element path ("text",
	// "title"), in order.
	texts map[string][]string
	attrs []xml.Attr
	badge []string
}

func (d svgDoc) badges() []string { return d.badge }

// wellFormed parses s strictly as XML and returns what it holds.
func wellFormed(t *testing.T, s string) svgDoc {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(s))
	dec.Strict = true
	doc := svgDoc{elements: map[string]int{}, texts: map[string][]string{}}
	var stack []string
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, s)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if depth == 0 && (tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg") {
				t.Fatalf("root element %v, want svg in the SVG namespace", tok.Name)
			}
			depth++
			stack = append(stack, tok.Name.Local)
			doc.elements[tok.Name.Local]++
			doc.attrs = append(doc.attrs, tok.Attr...)
		case xml.EndElement:
			depth--
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				doc.texts[stack[len(stack)-1]] = append(doc.texts[stack[len(stack)-1]], string(tok))
			}
		}
	}
	if depth != 0 {
		t.Fatalf("unbalanced SVG")
	}
	// The badges, in document order.
	for _, part := range strings.Split(s, `<g class="fg-rb-badge">`)[1:] {
		_, after, _ := strings.Cut(part, `text-anchor="middle">`)
		n, _, _ := strings.Cut(after, "<")
		doc.badge = append(doc.badge, n)
	}
	return doc
}

func TestHostileNamesAreEscaped(t *testing.T) {
	long := strings.Repeat("ж", 200)
	hostile := []string{
		`<script>alert(1)</script>`, `a&b&amp;`, `"quoted' name"`, "\u202Eevil\u2066x", long,
		`]]><x/>`, "bad\xffutf8", "ctl\x01\x1b[31m", `</title><svg onload=alert(1)>`,
	}
	g := &Graph{Key: `k<&>"`, Now: t0.Add(time.Minute)}
	for i, name := range hostile {
		nd := Node{Name: name, Type: "task", Kind: `kind"><b>`, HasRollback: true,
			Do: Run{State: "failed", Attempts: 2, Start: t0, End: t0.Add(time.Second), Error: `<img src=x onerror=alert(1)>`}}
		if i > 0 {
			nd.Needs = []string{hostile[i-1]}
		}
		nd.Undo = Run{State: "succeeded", Start: t0.Add(time.Duration(10-i) * time.Second), End: t0.Add(time.Duration(11-i) * time.Second)}
		nd.Do.Spans = []Span{{Start: t0, End: t0.Add(time.Second), Attempt: 1, Outcome: "failed", Error: `"><script>`}}
		nd.State = stateOf(nd, "")
		g.Nodes = append(g.Nodes, nd)
	}
	g.Layout()
	if len(g.Edges) != len(hostile)-1 {
		t.Fatalf("%d edges, want %d: hostile names must still match their needs", len(g.Edges), len(hostile)-1)
	}
	for _, s := range []string{g.SVG(), g.Timeline()} {
		doc := wellFormed(t, s)
		for _, el := range []string{"script", "x", "img", "b"} {
			if doc.elements[el] > 0 {
				t.Errorf("a name made a <%s> element", el)
			}
		}
		if doc.elements["svg"] != 1 {
			t.Errorf("%d svg elements, want 1", doc.elements["svg"])
		}
		for _, a := range doc.attrs {
			if strings.HasPrefix(strings.ToLower(a.Name.Local), "on") {
				t.Errorf("a name made the attribute %s", a.Name.Local)
			}
		}
		for _, bad := range []string{"\u202E", "\u2066", "\x01", "\x1b", "\xff"} {
			if strings.Contains(s, bad) {
				t.Errorf("the SVG holds %q", bad)
			}
		}
		all := strings.Join(doc.texts["title"], "\n")
		for _, name := range hostile {
			if !strings.Contains(all, Clean(name)) {
				t.Errorf("no title holds the whole name %q", Clean(name))
			}
		}
	}
	doc := wellFormed(t, g.SVG())
	shown := doc.texts["text"]
	if !slices.Contains(shown, cut(long, nameAt)) || !strings.HasSuffix(cut(long, nameAt), "…") {
		t.Errorf("the 200-rune name is not cut to fit: %q", shown)
	}
	if !slices.Contains(shown, `<script>alert(1)</script>`) {
		t.Errorf("the script name is not shown as text: %q", shown)
	}
	var out bytes.Buffer
	_ = g.Text(&out, false)
	if strings.ContainsAny(out.String(), "\x1b\x01\u202E") {
		t.Errorf("text output holds a control character:\n%q", out.String())
	}
}

func TestTimeline(t *testing.T) {
	g := graph("a", "b:a", "c:a")
	g.Nodes[0].Do = Run{State: "succeeded", Start: t0, End: t0.Add(2 * time.Second), Attempts: 2,
		Spans: []Span{{Start: t0, End: t0.Add(time.Second), Attempt: 1, Outcome: "failed"}, {Start: t0.Add(time.Second), End: t0.Add(2 * time.Second), Attempt: 2, Outcome: "succeeded"}}}
	g.Nodes[1].Do = Run{State: "active", Start: t0.Add(2 * time.Second), Attempts: 1}
	g.Nodes[2].HasRollback = true
	g.Nodes[2].Do = Run{State: "succeeded", Start: t0.Add(2 * time.Second), End: t0.Add(3 * time.Second), Attempts: 1}
	g.Nodes[2].Undo = Run{State: "succeeded", Start: t0.Add(20 * time.Second), End: t0.Add(25 * time.Second), Attempts: 1}
	g.Now = t0.Add(30 * time.Second)
	g.Layout()
	s := g.Timeline()
	doc := wellFormed(t, s)
	if n := strings.Count(s, `class="fg-bar `); n != 5 {
		t.Errorf("%d bars, want 5 (two attempts of a, the running b, c and its rollback)", n)
	}
	if n := strings.Count(s, `fg-bar-undo`); n != 1 {
		t.Errorf("%d rollback bars, want 1", n)
	}
	// 30 s: a tick every 5 s, labelled from the start.
	want := []string{"from 04:00:00Z", "0", "5s", "10s", "15s", "20s", "25s", "30s"}
	if got := doc.texts["text"][:len(want)]; !reflect.DeepEqual(got, want) {
		t.Errorf("axis labels %q, want %q", got, want)
	}
	if !strings.Contains(s, `class="fg-bar fg-o-running"`) || !strings.Contains(s, `x="900.0"`) {
		t.Errorf("the running attempt does not reach now at the right edge:\n%s", s)
	}
	empty := graph("a")
	if s := empty.Timeline(); !strings.Contains(s, "no step has started") {
		t.Errorf("empty time line: %s", s)
	}
}

func TestTickStep(t *testing.T) {
	for _, c := range []struct {
		d, want time.Duration
	}{{30 * time.Millisecond, 10 * time.Millisecond}, {time.Second, 200 * time.Millisecond}, {30 * time.Second, 5 * time.Second},
		{90 * time.Minute, 15 * time.Minute}, {1000 * 24 * time.Hour, 1000 * 24 * time.Hour / 8}} {
		got := TickStep(c.d)
		if got < c.want || c.d/got >= maxTicks+1 {
			t.Errorf("TickStep(%v) = %v, want %v", c.d, got, c.want)
		}
	}
	for _, c := range []struct {
		d    time.Duration
		want string
	}{{0, "0"}, {500 * time.Millisecond, "500ms"}, {time.Minute, "1m"}, {90 * time.Second, "1m30s"}, {2 * time.Hour, "2h"}, {10 * time.Second, "10s"}} {
		if got := tickLabel(c.d); got != c.want {
			t.Errorf("tickLabel(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestText(t *testing.T) {
	g := graph("check", "quota:check", "ip:check", "create:quota,ip")
	g.Nodes[0].Do = Run{State: "succeeded", Attempts: 1, Start: t0, End: t0.Add(1500 * time.Millisecond)}
	g.Nodes[0].State = Succeeded
	g.Nodes[1].Do = Run{State: "active", Attempts: 2, Start: t0.Add(2 * time.Second)}
	g.Nodes[1].State = Running
	g.Nodes[1].Do.Error = "quota\nexceeded"
	g.Nodes[0].HasRollback = true
	var out bytes.Buffer
	if err := g.Text(&out, false); err != nil {
		t.Fatal(err)
	}
	want := `LEVEL  STEP    KIND  STATE      ATTEMPTS  TOOK  NEEDS     ROLLBACK
1      check   task  succeeded  1         1.5s  -         -
2      quota   task  running    2         58s   check     none
2      ip      task  waiting    0         -     check     none
3      create  task  waiting    0         -     quota,ip  none
quota do error: quota exceeded
`
	if out.String() != want {
		t.Errorf("text:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	_ = g.Text(&out, true)
	if !strings.Contains(out.String(), "\x1b[32msucceeded\x1b[0m") {
		t.Errorf("colour text lacks the coloured state:\n%q", out.String())
	}
}
