package web_test

// The flow page's picture over HTTP: hostile step names stay text, both
// SVGs parse as XML, the DAG's edges and levels are the flow's.

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
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
	// The steps table names each step's type and needs; the list counts
	// the steps done and names the running one.
	for _, want := range []string{`<td>signal<div class="note">needs <bdi>a&amp;b&amp;amp;c, &#34;q&#39;</bdi></div></td>`,
		`<tr class="current"><td>1</td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("the steps table lacks %q", want)
		}
	}
	e.wantPage("/flows", 200, `<td>0 of 5 done; running <bdi>&lt;script&gt;alert(1)&lt;/script&gt;</bdi></td>`)
}

// The flow page names a fan-in step's max_failed_needs in the steps
// table and in its box's hover text.
func TestFlowPageShowsMaxFailedNeeds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	spec := flow.Spec{Key: "fleet", Steps: []flow.Step{
		{Name: "u1", Action: flow.Action{Kind: "noop"}},
		{Name: "u2", Action: flow.Action{Kind: "noop"}},
		{Name: "all", Needs: []string{"u1", "u2"}, MaxFailedNeeds: 1, Action: flow.Action{Kind: "noop"}},
	}}
	if _, _, err := flow.Publish(t.Context(), e.store, spec); err != nil {
		t.Fatal(err)
	}
	body := e.wantPage("/flow?key=fleet", 200, `<div class="note">needs <bdi>u1, u2</bdi>; max_failed_needs 1</div>`)
	if !strings.Contains(body, "needs u1, u2 (max_failed_needs 1)</title>") {
		t.Errorf("the fan-in step's box does not name its max_failed_needs")
	}
}

func TestFlowPageSignalForm(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	spec := func(key string) flow.Spec {
		return flow.Spec{Key: key, Steps: []flow.Step{
			{Name: "approve", Type: flow.TypeSignal},
			{Name: "create", Needs: []string{"approve"}, Action: flow.Action{Kind: "noop"}},
		}}
	}
	for _, key := range []string{"f1", "f2"} {
		if _, _, err := flow.Publish(t.Context(), e.store, spec(key)); err != nil {
			t.Fatal(err)
		}
	}
	body := e.wantPage("/flow?key=f1", 200, `<form method="post" action="/flow/signal" class="signal-form" data-step="approve">`,
		`name="step" value="approve"`, `id="signal-payload-0"`)
	csrf := csrfField.FindStringSubmatch(body)[1]
	wrong := "0" + csrf[1:] // another token: its first digit changed
	if csrf[0] == '0' {
		wrong = "1" + csrf[1:]
	}
	post := func(form url.Values) (int, string) {
		return e.send("POST", "/flow/signal", form, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "same-origin") })
	}
	for _, bad := range []struct {
		form url.Values
		code int
		says string
	}{
		{url.Values{"key": {"f1"}, "step": {"approve"}}, 403, "csrf"},
		{url.Values{"csrf": {wrong}, "key": {"f1"}, "step": {"approve"}}, 403, "csrf"},
		{url.Values{"csrf": {csrf}, "step": {"approve"}}, 400, "key"},
		{url.Values{"csrf": {csrf}, "key": {"f1"}}, 400, "step"},
		{url.Values{"csrf": {csrf}, "key": {"f1"}, "step": {"nope"}}, 400, "step"},
		{url.Values{"csrf": {csrf}, "key": {"f1"}, "step": {"create"}}, 400, "not a signal step"},
		{url.Values{"csrf": {csrf}, "key": {"f1"}, "step": {"approve"}, "payload": {`{"a":`}}, 400, "payload"},
		{url.Values{"csrf": {csrf}, "key": {"f1"}, "step": {"approve"}, "payload": {deepJSON(200)}}, 400, "payload"},
		{url.Values{"csrf": {csrf}, "key": {"nope"}, "step": {"approve"}}, 404, "flow not found"},
	} {
		if code, out := post(bad.form); code != bad.code || !strings.Contains(out, bad.says) {
			t.Errorf("POST %v: %d, want %d saying %q:\n%s", bad.form, code, bad.code, bad.says, out)
		}
	}
	if f, err := flow.Get(t.Context(), e.store, "f1"); err != nil || f.Progress[0].Signal != nil {
		t.Fatalf("refused signals changed the flow: %v %+v", err, f.Progress[0])
	}

	ok := url.Values{"csrf": {csrf}, "key": {"f1"}, "step": {"approve"}, "payload": {` {"by": "ops"} `}}
	if code, to := post(ok); code != 303 || to != "/flow?key=f1&msg=signal-sent" {
		t.Fatalf("signal: %d %s", code, to)
	}
	f, err := flow.Get(t.Context(), e.store, "f1")
	if err != nil || string(f.Params["approve"]) != `{"by":"ops"}` {
		t.Fatalf("after the signal: %v, params %s", err, f.Params["approve"])
	}
	e.wantPage("/flow?key=f1&msg=signal-sent", 200, "signal sent")
	if body := e.wantPage("/flow?key=f1", 200); strings.Contains(body, `action="/flow/signal"`) {
		t.Errorf("the signalled step still offers the form")
	}
	if code, to := post(ok); code != 303 || to != "/flow?key=f1&msg=signal-twice" {
		t.Errorf("second signal: %d %s, want the refusal's message", code, to)
	}
	if _, err := flow.Cancel(t.Context(), e.store, "f2", false); err != nil {
		t.Fatal(err)
	}
	ok.Set("key", "f2")
	if code, to := post(ok); code != 303 || to != "/flow?key=f2&msg=signal-finished" {
		t.Errorf("signal to a cancelled flow: %d %s, want the refusal's message", code, to)
	}
	if body := e.wantPage("/flow?key=f2", 200); strings.Contains(body, `action="/flow/signal"`) {
		t.Errorf("a cancelled flow offers the signal form")
	}

	// Read-only: no form, and the route refuses.
	ro := newEnv(t, web.Config{ReadOnly: true})
	if _, _, err := flow.Publish(t.Context(), ro.store, spec("f1")); err != nil {
		t.Fatal(err)
	}
	if body := ro.wantPage("/flow?key=f1", 200, `id="flow-graph"`); strings.Contains(body, `action="/flow/signal"`) {
		t.Errorf("a read-only page offers the signal form")
	}
	if code, _ := ro.send("POST", "/flow/signal", url.Values{"key": {"f1"}, "step": {"approve"}}, nil); code != 403 {
		t.Errorf("read-only signal: %d, want 403", code)
	}
}

// BenchmarkFlowPage is the flow page of a finished run of the largest
// flow drawn in full (100 steps, 10 levels of 10, each step needing every step
// of the level before), its step tasks in the store:
//
//	go test -run '^$' -bench FlowPage -benchtime 50x ./web/
func BenchmarkFlowPage(b *testing.B) {
	ctx := context.Background()
	s := tempStore(b)
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s}); err != nil {
		b.Fatal(err)
	}
	mux.RegisterFunc("quick", func(context.Context, *consumer.Job) error { return nil })
	c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w", Concurrency: 10})
	if err != nil {
		b.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := c.Start(cctx); err != nil {
		b.Fatal(err)
	}
	defer c.Stop(context.Background())
	var steps []flow.Step
	for l := range 10 {
		for k := range 10 {
			st := flow.Step{Name: fmt.Sprintf("s%d-%d", l, k), Action: flow.Action{Kind: "quick"}}
			for p := range 10 {
				if l > 0 {
					st.Needs = append(st.Needs, fmt.Sprintf("s%d-%d", l-1, p))
				}
			}
			steps = append(steps, st)
		}
	}
	if _, _, err := flow.Publish(ctx, s, flow.Spec{Key: "big", Steps: steps}); err != nil {
		b.Fatal(err)
	}
	testutil.EventuallyEvery(b, 10*time.Minute, 50*time.Millisecond, "the big flow to finish", func() bool {
		f, err := flow.Get(ctx, s, "big")
		if err != nil {
			b.Fatal(err)
		}
		return f.State.Finished()
	})
	h, err := web.NewHandler(web.Config{Store: s})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for b.Loop() {
		resp, err := http.Get(srv.URL + "/flow?key=big")
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET = %d", resp.StatusCode)
		}
		b.ReportMetric(float64(n), "bytes/page")
	}
}
