package web_test

// The dashboard's charts in a real headless Chromium: tasks of three kinds
// (one named with markup) run on a real consumer whose outcomes a
// stats.Recorder counts; the overview's charts must carry exactly the
// counts the store holds, the task page draws a task's attempts, the
// Devices page counts the fleet by state and by attribute, the dark theme follows the emulated
// system setting, and no page scrolls sideways at 375 px.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// hostileKind is a kind whose name is markup: the charts must show it as
// text.
const hostileKind = `notify<img src=x onerror="document.title='pwned'">&`

// storeCounts are the counts the charts must show for one kind, read from
// the store: its tasks by final state, and its failed attempts before the
// last (retried).
type storeCounts struct{ succeeded, failed, retried int }

func countStore(t *testing.T, s task.Store, kind string) storeCounts {
	t.Helper()
	list, err := s.List(t.Context(), task.ListQuery{Kind: kind})
	if err != nil {
		t.Fatal(err)
	}
	var c storeCounts
	for _, tk := range list {
		fails := 0
		for _, a := range tk.AttemptHistory() {
			if a.State == task.AttemptFail {
				fails++
			}
		}
		switch tk.State {
		case task.StateSucceeded:
			c.succeeded++
			c.retried += fails
		case task.StateFailed:
			c.failed++
			c.retried += fails - 1
		default:
			t.Fatalf("%s is %s: want every task finished", tk.Key, tk.State)
		}
	}
	return c
}

// countingObserver counts the outcomes it passes on.
type countingObserver struct {
	consumer.Observer
	finished atomic.Int64
}

func (o *countingObserver) Finished(e consumer.FinishEvent) {
	o.Observer.Finished(e)
	o.finished.Add(1)
}

func TestChartsInBrowser(t *testing.T) {
	testservers.Chromium(t) // fail first when there is no browser
	began := time.Now()
	s := tempStore(t)
	rec, err := stats.NewRecorder(stats.RecorderConfig{Store: s, Every: time.Hour}) // flushed by the test
	if err != nil {
		t.Fatal(err)
	}
	mux := consumer.NewMux()
	mux.RegisterFunc("resize", func(context.Context, *consumer.Job) error { return nil })
	mux.RegisterFunc(hostileKind, func(_ context.Context, job *consumer.Job) error {
		if n, _ := strconv.Atoi(job.Task.Key[len(job.Task.Key)-1:]); n%3 == 0 {
			return errors.New("smtp said no")
		}
		return nil
	})
	mux.RegisterFunc("flaky", func(context.Context, *consumer.Job) error { return errors.New("device busy") })
	obs := &countingObserver{Observer: rec}
	runConsumer(t, consumer.Config{Store: s, Handler: mux, Observer: obs, Kinds: []string{"resize", hostileKind, "flaky"}})
	publishJSON := func(key, kind, payload string, o task.Options) {
		t.Helper()
		if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: key, Kind: kind, Payload: []byte(payload), Options: o}); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(key, kind string, o task.Options) { t.Helper(); publishJSON(key, kind, `{}`, o) }
	var keys []string
	for i := range 12 {
		publish("resize-"+strconv.Itoa(i), "resize", task.Options{})
		keys = append(keys, "resize-"+strconv.Itoa(i))
	}
	for i := range 6 {
		publish("mail-"+strconv.Itoa(i), hostileKind, task.Options{MaxUnexpectedRetries: task.NoRetries})
		keys = append(keys, "mail-"+strconv.Itoa(i))
	}
	for i := range 2 {
		publish("flaky-"+strconv.Itoa(i), "flaky", task.Options{MaxUnexpectedRetries: 2})
		keys = append(keys, "flaky-"+strconv.Itoa(i))
	}
	attempts := int64(0)
	for _, k := range keys {
		testutil.Eventually(t, time.Minute, k+" to finish", func() bool {
			tk, err := s.Get(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			if tk.State.Finished() {
				attempts += int64(len(tk.AttemptHistory()))
			}
			return tk.State.Finished()
		})
	}
	// The consumer tells the recorder of an outcome just after writing it:
	// flush once it has told every attempt's.
	testutil.Eventually(t, time.Minute, fmt.Sprintf("the recorder to be told the outcomes of the %d attempts stored", attempts),
		func() bool { return obs.finished.Load() >= attempts })
	// Devices for the fleet view: two online, one offline, commands queued.
	now := s.Now()
	states := mqttdev.StoreStates(s)
	for id, online := range map[string]bool{"pump-1": true, "pump-2": true, "valve-9": false} {
		if err := states.PutDeviceState(t.Context(), mqttdev.DeviceState{ID: id, Online: online, At: now, SeenAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	for id, l := range map[string]mqttdev.Labels{"pump-1": {"model": "pump-x", "site": "berlin"},
		"pump-2": {"model": "pump-x", "site": "paris"}, "valve-9": {"model": "valve-2", "site": "berlin"}} {
		if _, err := mqttdev.SetLabels(t.Context(), s, id, mqttdev.LabelChange{Set: l}); err != nil {
			t.Fatal(err)
		}
	}
	// pump-2 announces a site of its own, shown apart from its label.
	if err := mqttdev.PutAttributes(t.Context(), s, "pump-2", mqttdev.Labels{"site": "berlin", "firmware": "1.2"}, now); err != nil {
		t.Fatal(err)
	}
	publishJSON("cmd-1", mqttdev.Kind, `{"device":"pump-1","command":"flush"}`, task.Options{})
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	srv, bctx := dashboard(t, s)

	// The overview's charts carry the store's counts.
	do(t, bctx, "open the overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#chart-all")))
	chartCounts := func(sel string) storeCounts {
		t.Helper()
		var got storeCounts
		for _, f := range []struct {
			attr string
			n    *int
		}{{"succeeded", &got.succeeded}, {"failed", &got.failed}, {"retried", &got.retried}} {
			s, err := chromedp.Run(bctx, chromedp.Evaluate[string](`(document.querySelector(`+strconv.Quote(sel)+`) || {getAttribute: () => "missing"}).getAttribute("data-`+f.attr+`")`))
			if err != nil {
				t.Fatal(err)
			}
			if *f.n, err = strconv.Atoi(s); err != nil {
				t.Fatalf("%s data-%s = %q", sel, f.attr, s)
			}
		}
		return got
	}
	var all storeCounts
	for _, kind := range []string{"resize", hostileKind, "flaky"} {
		want := countStore(t, s, kind)
		all.succeeded += want.succeeded
		all.failed += want.failed
		all.retried += want.retried
		got := chartCounts(`svg.throughput[data-kind="` + jsAttr(kind) + `"]`)
		if got != want {
			t.Errorf("chart of %q shows %+v, the store holds %+v", kind, got, want)
		}
	}
	if all != (storeCounts{succeeded: 16, failed: 4, retried: 4}) {
		t.Errorf("the store holds %+v: the test's handlers should have made 16 succeeded, 4 failed, 4 retried", all)
	}
	if got := chartCounts("#chart-all"); got != all {
		t.Errorf("the all-kinds chart shows %+v, the store holds %+v", got, all)
	}
	if title, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.title`)); err != nil || title == "pwned" {
		t.Errorf("the hostile kind name ran as markup (title %q, %v)", title, err)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#chart-pending circle.dot").length`)); err != nil || n < 1 {
		t.Errorf("the queue chart has %d samples (%v), want at least 1", n, err)
	}
	screenshot(t, bctx, "charts")
	do(t, bctx, "the day's charts", chromedp.Click(chromedp.CSS("#range-day")))
	waitFor(t, bctx, "the day range", `location.search === "?range=day" && document.querySelector("#chart-all") !== null`)
	if got := chartCounts("#chart-all"); got != all {
		t.Errorf("the day's all-kinds chart shows %+v, the store holds %+v", got, all)
	}

	// A task's attempts as a time line: flaky-0 ran three times.
	do(t, bctx, "open a flaky task", chromedp.Navigate(srv.URL+"/task?key=flaky-0"), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#timeline g.attempt[data-outcome=FAIL]").length`)); err != nil || n != 3 {
		t.Errorf("the time line draws %d failed attempts (%v), want 3", n, err)
	}
	screenshot(t, bctx, "task-timeline")

	// The fleet view.
	do(t, bctx, "open the devices page", chromedp.Navigate(srv.URL+"/devices"), chromedp.WaitVisible(chromedp.CSS("#fleet-states")))
	for sel, want := range map[string]string{"#fleet-online": "2", "#fleet-offline": "1", "#fleet-unknown": "0"} {
		if got := text(t, bctx, sel); got != want {
			t.Errorf("devices %s = %q, want %q", sel, got, want)
		}
	}
	// By label: model (the first name) and site; by announced attribute:
	// firmware and site.
	for attr, want := range map[string]string{
		`#fleet-label-0 g.item[data-label="pump-x"]`: "2", `#fleet-label-0 g.item[data-label="valve-2"]`: "1",
		`#fleet-label-1 g.item[data-label="berlin"]`: "2", `#fleet-label-1 g.item[data-label="paris"]`: "1",
		`#fleet-attr-0 g.item[data-label="1.2"]`: "1", `#fleet-attr-1 g.item[data-label="berlin"]`: "1",
	} {
		got, err := chromedp.Run(bctx, chromedp.Evaluate[string](`(document.querySelector(`+strconv.Quote(attr)+`) || {getAttribute: () => "missing"}).getAttribute("data-n")`))
		if err != nil || got != want {
			t.Errorf("fleet %s: %q (%v), want %s", attr, got, err, want)
		}
	}
	if got := strings.TrimSpace(text(t, bctx, `#devices tr[data-device="pump-2"] .labels`)) + " / " + strings.TrimSpace(text(t, bctx, `#devices tr[data-device="pump-2"] .attrs`)); got != "model=pump-x site=paris / firmware=1.2 site=berlin" {
		t.Errorf("pump-2's labels / attributes: %q", got)
	}
	// Labelled, but nobody vouched for them: all three marked new.
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#devices .badge.new").length`)); err != nil || n != 3 {
		t.Errorf("%d devices marked new (%v), want 3", n, err)
	}
	screenshot(t, bctx, "devices")
	if got := text(t, bctx, `#devices tr[data-device="pump-1"] .cmds`); !strings.HasPrefix(got, "flush pending") {
		t.Errorf("pump-1's last commands: %q, want flush pending", got)
	}

	// The dark theme follows the system setting.
	if _, err := chromedp.Call(bctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	do(t, bctx, "the overview, dark", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#chart-all")))
	for expr, want := range map[string]string{
		`getComputedStyle(document.body).backgroundColor`:                                                            "rgb(13, 17, 23)",
		`getComputedStyle(document.querySelector("#chart-all rect.s-succeeded")).fill`:                               "rgb(63, 185, 80)",
		`getComputedStyle(document.querySelector("table")).backgroundColor`:                                          "rgb(22, 27, 34)",
		`matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"`:                                      "dark",
		`getComputedStyle(document.querySelector("#chart-all .axis text")).fill !== "rgb(0, 0, 0)" ? "ok" : "black"`: "ok",
	} {
		if got, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr)); err != nil || got != want {
			t.Errorf("dark: %s = %q (%v), want %q", expr, got, err, want)
		}
	}
	screenshot(t, bctx, "charts-dark")

	// 375 px wide: no page scrolls sideways (wide tables scroll in their
	// own box).
	if _, err := chromedp.Call(bctx, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
		Width: 375, Height: 812, DeviceScaleFactor: 1, Mobile: true}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/?range=day", "/tasks", "/task?key=" + url.QueryEscape("mail-0"), "/task?key=flaky-0",
		"/devices", "/workers", "/controls", "/flows"} {
		do(t, bctx, "open "+path+" at 375 px", chromedp.Navigate(srv.URL+path), chromedp.WaitReady(chromedp.CSS("footer")))
		w, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
		if err != nil || w > 375 {
			t.Errorf("%s at 375 px: the page is %d px wide (%v)", path, w, err)
		}
		if path == "/" {
			screenshot(t, bctx, "charts-375")
		}
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}

// jsAttr escapes s for a double-quoted CSS attribute selector.
func jsAttr(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}
