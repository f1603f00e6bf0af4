package web_test

// A rollout followed live on its page in a real headless Chromium: the
// rollout driver dispatches device commands in waves to a consumer whose
// device handler stands in for the devices (one of them fails); the page
// follows the waves without a reload, pauses the rollout (nothing more is
// dispatched), resumes it, and ends with the bars the store holds.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
)

// rolloutTasks counts the device tasks rollout name has published.
func rolloutTasks(t *testing.T, s task.Store, name string) (all, succeeded, failed int) {
	t.Helper()
	list, err := s.List(t.Context(), task.ListQuery{Kind: mqttdev.Kind, KeyPrefix: "rollout:" + name + ":"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range list {
		switch tk.State {
		case task.StateSucceeded:
			succeeded++
		case task.StateFailed:
			failed++
		}
	}
	return len(list), succeeded, failed
}

func TestRolloutPageInBrowser(t *testing.T) {
	testservers.Chromium(t) // fail first when there is no browser
	began := time.Now()
	s := tempStore(t)
	mux := consumer.NewMux()
	mux.RegisterFunc(mqttdev.Kind, func(ctx context.Context, job *consumer.Job) error {
		var cmd mqttdev.Command
		if err := json.Unmarshal(job.Task.Payload, &cmd); err != nil {
			return err
		}
		select {
		case <-time.After(150 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		if cmd.Device == "dev-03" {
			return errors.New("flash write error")
		}
		return nil
	})
	ctx := runConsumer(t, consumer.Config{Store: s, Handler: mux})
	drv, err := rollout.NewDriver(rollout.DriverConfig{Store: s, WorkerID: "worker-1", Every: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Stop(context.Background()) })

	var devices []string
	for i := range 15 {
		devices = append(devices, "dev-"+strconv.Itoa(100 + i)[1:])
	}
	waves, err := rollout.ParseWaves("1,25%,100%")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := rollout.ParseAbortRules("failed>40% after 5")
	if err != nil {
		t.Fatal(err)
	}
	// Two commands a second: the last wave (11 devices) takes 5 s, long
	// enough to pause it half way on a loaded machine.
	rate, err := rollout.ParseRate("2/1s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rollout.Create(t.Context(), s, "firmware-7", rollout.Spec{Command: "flash", Devices: devices,
		Waves: waves, AbortWhen: rules, Rate: rate, Retries: 0}); err != nil {
		t.Fatal(err)
	}

	srv, bctx := dashboard(t, s)

	do(t, bctx, "open the rollouts", chromedp.Navigate(srv.URL+"/rollouts"),
		chromedp.WaitVisible(chromedp.CSS(`#rollouts tr[data-rollout="firmware-7"]`)))
	do(t, bctx, "open the rollout", chromedp.Click(chromedp.CSS(`#rollouts a[href="/rollout?name=firmware-7"]`)))
	waitFor(t, bctx, "the rollout's page", `location.pathname === "/rollout" && !!document.querySelector("#rollout-waves")`)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`window.sameLoad = true`)); err != nil {
		t.Fatal(err)
	}
	// Followed live: the third wave starts and fills without a reload.
	wave := func(n int, attr string) string {
		return `(document.querySelector('#rollout-waves g.wave[data-wave="` + strconv.Itoa(n) + `"]') || {getAttribute: () => ""}).getAttribute("` + attr + `")`
	}
	waitFor(t, bctx, "wave 3 running with a command done", wave(3, "data-state")+` === "running" && Number(`+wave(3, "data-succeeded")+`) >= 1`)
	if same, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.sameLoad === true`)); err != nil || !same {
		t.Errorf("the page was loaded again (%v): want live updates in place", err)
	}
	screenshot(t, bctx, "rollout-running")

	// Pause from the page: nothing more is dispatched.
	do(t, bctx, "pause", chromedp.Click(chromedp.CSS("#rollout-pause")))
	waitFor(t, bctx, "paused", `(document.querySelector("#flash") || {}).textContent === "rollout paused: running commands finish, nothing new is sent" && document.querySelector("#rollout-state").textContent === "paused"`)
	// A dispatch recorded before the pause is published just after the
	// driver's write that recorded it, which a loaded machine can put
	// after the pause: count once every recorded dispatch is stored.
	before, recorded := 0, 0
	if !testutil.Within(time.Minute, func() bool {
		ro, err := rollout.Get(t.Context(), s, "firmware-7")
		if err != nil {
			t.Fatal(err)
		}
		recorded = 0
		for _, e := range ro.Devices {
			recorded += e.Attempt
		}
		before, _, _ = rolloutTasks(t, s, "firmware-7")
		return before == recorded
	}) {
		t.Fatalf("paused: %d device tasks stored, %d dispatches recorded", before, recorded)
	}
	if before == len(devices) {
		t.Errorf("paused: %d device tasks: want some devices left", before)
	}
	// More than two rate slots: the window is the point.
	testutil.Consistently(t, 1200*time.Millisecond, fmt.Sprintf("%d device tasks, no new one while paused", before), func() bool {
		n, _, _ := rolloutTasks(t, s, "firmware-7")
		return n == before
	})
	if ro, err := rollout.Get(t.Context(), s, "firmware-7"); err != nil || ro.State != rollout.StatePaused {
		t.Fatalf("the store says %v (%v), want paused", ro.State, err)
	}
	screenshot(t, bctx, "rollout-paused")

	// Resume from the page, and follow it to the end.
	do(t, bctx, "resume", chromedp.Click(chromedp.CSS("#rollout-resume")))
	waitFor(t, bctx, "resumed", `(document.querySelector("#flash") || {}).textContent === "rollout resumed"`)
	waitFor(t, bctx, "completed", `document.querySelector("#rollout-state").textContent === "completed"`)
	ro, err := rollout.Get(t.Context(), s, "firmware-7")
	if err != nil {
		t.Fatal(err)
	}
	p := ro.Progress()
	all, succeeded, failed := rolloutTasks(t, s, "firmware-7")
	if p.State != rollout.StateCompleted || all != len(devices) || succeeded != 14 || failed != 1 ||
		p.Total.Succeeded != succeeded || p.Total.Failures() != failed {
		t.Fatalf("store: %s, %d tasks (%d succeeded, %d failed), progress %+v: want completed, 15 tasks, 14 and 1",
			p.State, all, succeeded, failed, p.Total)
	}
	for _, w := range p.Waves {
		for attr, want := range map[string]int{"data-size": w.Size, "data-succeeded": w.Counts.Succeeded, "data-failed": w.Counts.Failures()} {
			got, err := chromedp.Run(bctx, chromedp.Evaluate[string](wave(w.Index+1, attr)))
			if err != nil || got != strconv.Itoa(want) {
				t.Errorf("wave %d %s: the page says %q (%v), the store %d", w.Index+1, attr, got, err, want)
			}
		}
	}
	rate2, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("#rollout-waves").getAttribute("data-failure-rate") + " " + document.querySelector("#rollout-waves").getAttribute("data-abort-at")`))
	if err != nil || rate2 != "6.7 40" {
		t.Errorf("failure rate and threshold drawn: %q (%v), want 6.7 40", rate2, err)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#rollout-waves line.threshold").length`)); err != nil || n != len(p.Waves)+1 {
		t.Errorf("%d threshold lines (%v), want one per wave and one on the rate", n, err)
	}
	if got := text(t, bctx, "#rollout-events"); !strings.Contains(got, rollout.EventPaused) || !strings.Contains(got, rollout.EventResumed) {
		t.Errorf("events:\n%s\nwant the pause and the resume", got)
	}
	screenshot(t, bctx, "rollout")

	// 375 px wide: neither page scrolls sideways.
	if _, err := chromedp.Call(bctx, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
		Width: 375, Height: 812, DeviceScaleFactor: 1, Mobile: true}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/rollouts", "/rollout?name=firmware-7"} {
		do(t, bctx, "open "+path+" at 375 px", chromedp.Navigate(srv.URL+path), chromedp.WaitReady(chromedp.CSS("footer")))
		if w, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); err != nil || w > 375 {
			t.Errorf("%s at 375 px: the page is %d px wide (%v)", path, w, err)
		}
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}
