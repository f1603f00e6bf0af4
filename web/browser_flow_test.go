package web_test

// The flow page in a real headless Chromium: a DAG flow with a signal step
// runs on a real consumer with the flow middleware; the page shows the
// steps' states change without a reload, sends the signal, and shows the
// flow finish. A second flow fails in a branch and shows its rollback
// path.

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testservers"
)

// stepState is the JavaScript for the state the DAG draws step name in.
func stepState(name string) string {
	return `((document.querySelector('#flow-graph [data-step=` + strconv.Quote(name) + `]') || {dataset: {}}).dataset.state || "")`
}

func TestFlowPageInBrowser(t *testing.T) {
	testservers.Chromium(t) // fail first when there is no browser
	start := time.Now()
	s := tempStore(t)
	gate := make(chan struct{})
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s}); err != nil {
		t.Fatal(err)
	}
	mux.RegisterFunc("quick", func(context.Context, *consumer.Job) error { return nil })
	mux.RegisterFunc("gated", func(ctx context.Context, job *consumer.Job) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	mux.RegisterFunc("broken", func(context.Context, *consumer.Job) error {
		return errors.New("quota service said no")
	})
	ctx := runConsumer(t, consumer.Config{Store: s, Handler: mux})
	// The reconciler, as every worker runs it: it moves a flow on from a
	// step whose attempts all expired (a lease lost on a loaded machine).
	rec, err := flow.NewReconciler(flow.ReconcilerConfig{Store: s, WorkerID: "worker-1", Every: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	// Steps keep the default retries, so a lease lost under load runs
	// the step again rather than failing the flow.
	none := 0
	quick := flow.Action{Kind: "quick"}
	spec := flow.Spec{Key: "provision-7", Params: json.RawMessage(`{"name":"db-7"}`), Steps: []flow.Step{
		{Name: "check", Action: quick},
		{Name: "reserve-ip", Needs: []string{"check"}, Action: flow.Action{Kind: "gated"}, Rollback: &quick},
		{Name: "quota", Needs: []string{"check"}, Action: quick, Rollback: &quick},
		{Name: "approve", Type: flow.TypeSignal, Needs: []string{"reserve-ip", "quota"}},
		{Name: "create", Needs: []string{"approve"}, Action: quick},
		{Name: "bill", Needs: []string{"create"}, Action: quick},
	}}
	if _, _, err := flow.Publish(t.Context(), s, spec); err != nil {
		t.Fatal(err)
	}

	srv, bctx := dashboard(t, s)

	do(t, bctx, "open the flow", chromedp.Navigate(srv.URL+"/flow?key=provision-7"),
		chromedp.WaitVisible(chromedp.CSS("#flow-graph svg")))
	waitFor(t, bctx, "reserve-ip running", stepState("reserve-ip")+` === "running"`)
	waitFor(t, bctx, "quota succeeded", stepState("quota")+` === "succeeded"`)
	if got, err := chromedp.Run(bctx, chromedp.Evaluate[string](stepState("approve"))); err != nil || got != "waiting" {
		t.Errorf("approve drawn %q (%v), want waiting: it needs reserve-ip", got, err)
	}
	waitFor(t, bctx, "the event stream", `document.body.dataset.live === "connected"`)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`window.sameLoad = true`)); err != nil {
		t.Fatal(err)
	}

	// reserve-ip finishes: the page shows it and the signal step awaiting,
	// with its form, without being loaded again.
	close(gate)
	waitFor(t, bctx, "reserve-ip succeeded", stepState("reserve-ip")+` === "succeeded"`)
	waitFor(t, bctx, "approve awaiting its signal, with a form",
		stepState("approve")+` === "awaiting" && !!document.querySelector('#flow-signals form[data-step="approve"] textarea')`)
	if same, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.sameLoad === true`)); err != nil || !same {
		t.Errorf("the page was loaded again (%v): want live updates in place", err)
	}
	if got := text(t, bctx, "#flow-state"); got != "running" {
		t.Errorf("flow state %q, want running", got)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#flow-timeline .fg-bar").length`)); err != nil || n < 4 {
		t.Errorf("%d bars on the time line (%v), want one per started step", n, err)
	}
	screenshot(t, bctx, "flow")

	// Send the signal from the page: the flow takes its payload and
	// finishes.
	do(t, bctx, "send the signal",
		chromedp.SendKeys(chromedp.CSS(`#flow-signals form[data-step="approve"] textarea`), `{"approved_by": "ops"}`),
		chromedp.Click(chromedp.CSS(`#flow-signals form[data-step="approve"] button`)))
	waitFor(t, bctx, "the signal's message", `(document.querySelector("#flash") || {}).textContent === "signal sent"`)
	waitFor(t, bctx, "the flow succeeded", `document.querySelector("#flow-state").textContent === "succeeded"`)
	waitFor(t, bctx, "bill succeeded", stepState("bill")+` === "succeeded"`)
	f, err := flow.Get(t.Context(), s, "provision-7")
	if err != nil {
		t.Fatal(err)
	}
	if f.State != flow.StateSucceeded || string(f.Params["approve"]) != `{"approved_by":"ops"}` {
		t.Errorf("flow %s, approve's payload %s: want succeeded with the page's payload", f.State, f.Params["approve"])
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#flow-signals form").length`)); err != nil || n != 0 {
		t.Errorf("%d signal forms on a finished flow (%v), want none", n, err)
	}
	screenshot(t, bctx, "flow-succeeded")

	// A flow that fails in a branch rolls back; the page draws the path.
	fail := flow.Spec{Key: "provision-8", Steps: []flow.Step{
		{Name: "check", Action: quick, Rollback: &quick},
		{Name: "reserve-ip", Needs: []string{"check"}, Action: quick, Rollback: &quick},
		{Name: "quota", Needs: []string{"check"}, Action: flow.Action{Kind: "broken", Retries: &none}},
		{Name: "create", Needs: []string{"reserve-ip", "quota"}, Action: quick},
	}}
	if _, _, err := flow.Publish(t.Context(), s, fail); err != nil {
		t.Fatal(err)
	}
	do(t, bctx, "open the failing flow", chromedp.Navigate(srv.URL+"/flow?key=provision-8"),
		chromedp.WaitVisible(chromedp.CSS("#flow-graph svg")))
	waitFor(t, bctx, "the flow failed", `document.querySelector("#flow-state").textContent === "failed"`)
	waitFor(t, bctx, "the rollback path", `document.querySelectorAll("#flow-graph .fg-rb-badge").length === 2 && `+
		stepState("quota")+` === "failed" && `+stepState("check")+` === "rolled_back"`)
	if got, err := chromedp.Run(bctx, chromedp.Evaluate[string](stepState("create"))); err != nil || got != "skipped" {
		t.Errorf("create drawn %q (%v), want skipped", got, err)
	}
	screenshot(t, bctx, "flow-rolled-back")

	// Under a dark system theme the boxes and their text take the dark
	// colours: light text on a dark fill.
	if _, err := chromedp.Call(bctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	do(t, bctx, "the failed flow, dark", chromedp.Navigate(srv.URL+"/flow?key=provision-8"),
		chromedp.WaitVisible(chromedp.CSS("#flow-graph svg")))
	for expr, want := range map[string]string{
		`getComputedStyle(document.querySelector('#flow-graph [data-step="check"] .fg-box')).fill`:  "rgb(61, 29, 0)",
		`getComputedStyle(document.querySelector('#flow-graph [data-step="check"] .fg-name')).fill`: "rgb(230, 237, 243)",
		`getComputedStyle(document.querySelector('#flow-graph [data-step="quota"] .fg-box')).fill`:  "rgb(74, 15, 18)",
	} {
		if got, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr)); err != nil || got != want {
			t.Errorf("dark: %s = %q (%v), want %q", expr, got, err, want)
		}
	}
	screenshot(t, bctx, "flow-dark")
	t.Logf("took %v", time.Since(start))
}
