package web_test

// The dashboard in a real headless Chromium (Debian's chromium, which
// tests/servers up installs; the test fails without it), on a SQLite store
// with tasks in every state and a real consumer running their handlers.
// Screenshots go to the test's artifact directory (go test -artifacts).

import (
	"context"
	b64 "encoding/base64"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// fleet is a store with tasks in every state and the consumer running them.
type fleet struct {
	store task.Store
	// stopped receives the cause when a "block" handler returns.
	stopped chan error
	// failing makes "flaky" handlers fail while set.
	failing atomic.Bool
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	s := tempStore(t)
	f := &fleet{store: s, stopped: make(chan error, 8)}
	f.failing.Store(true)
	started := make(chan string, 8)
	mux := consumer.NewMux()
	mux.RegisterFunc("quick", func(context.Context, *consumer.Job) error { return nil })
	mux.RegisterFunc("block", func(ctx context.Context, job *consumer.Job) error {
		started <- job.Task.Key
		<-ctx.Done()
		f.stopped <- context.Cause(ctx)
		return ctx.Err()
	})
	mux.RegisterFunc("flaky", func(context.Context, *consumer.Job) error {
		if f.failing.Load() {
			return errors.New("flaky: the device said no")
		}
		return nil
	})
	runConsumer(t, consumer.Config{Store: s, Handler: mux})
	f.publish(t, "report-1", "quick", task.Options{})
	f.publish(t, "report-2", "quick", task.Options{})
	f.publish(t, "upload-7", "block", task.Options{})
	f.publish(t, "flash-3", "flaky", task.Options{MaxUnexpectedRetries: task.NoRetries})
	f.publish(t, "nightly-9", "quick", task.Options{RunAt: s.Now().Add(time.Hour)})
	f.publish(t, "stale-4", "unhandled", task.Options{})
	if _, err := task.Cancel(t.Context(), s, "stale-4"); err != nil {
		t.Fatal(err)
	}
	<-started
	for key, want := range map[string]task.State{"report-1": task.StateSucceeded, "report-2": task.StateSucceeded,
		"flash-3": task.StateFailed, "upload-7": task.StateRunning} {
		f.await(t, key, want)
	}
	return f
}

func (f *fleet) publish(t *testing.T, key, kind string, o task.Options) {
	t.Helper()
	_, _, err := task.Publish(t.Context(), f.store, task.PublishParams{Key: key, Kind: kind,
		Payload: []byte(`{"device":"bench-` + key + `"}`), Options: o})
	if err != nil {
		t.Fatal(err)
	}
}

// await waits until key's task is in state want.
func (f *fleet) await(t *testing.T, key string, want task.State) {
	t.Helper()
	for {
		got, err := f.store.Get(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == want {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: state %s, want %s", key, got.State, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runConsumer starts a consumer of cfg as worker-1, running four tasks at
// once and retrying without backoff; its context ends, and it stops, when
// t ends. It returns that context, for what runs beside it.
func runConsumer(t *testing.T, cfg consumer.Config) context.Context {
	t.Helper()
	cfg.WorkerID, cfg.Concurrency, cfg.RetryPolicy = "worker-1", 4, consumer.NoBackoff
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = c.Stop(context.Background())
	})
	return ctx
}

// dashboard serves the dashboard of s behind the login ops:pw until t
// ends, and returns the server and a browser logged in.
func dashboard(t *testing.T, s task.Store) (*httptest.Server, context.Context) {
	t.Helper()
	h, err := web.NewHandler(web.Config{Store: s, BasicUser: "ops", BasicPassword: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, browser(t, "Basic "+b64.StdEncoding.EncodeToString([]byte("ops:pw")))
}

// browser starts a headless Chromium that sends auth with every request and
// accepts every confirm dialog.
func browser(t *testing.T, auth string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(testservers.Chromium(t)),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 860))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders,
		network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for _, err := range chromedp.Events(ctx, page.JavascriptDialogOpening) {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return ctx
}

// do runs steps, failing t with what.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	t.Logf("%s", what)
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitFor waits until the JavaScript expression is true on the page. It
// evaluates again and again rather than with chromedp.Poll, which fails
// when the page navigates meanwhile (after a click on a link or button).
// Its failure shows the last evaluation error and the page's text, which
// say why the page is not as expected.
func waitFor(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	t.Logf("wait for %s", what)
	var err error
	if testutil.Within(2*time.Minute, func() bool { // a hang guard, not a speed target
		var ok bool
		ok, err = chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		return err == nil && ok
	}) {
		return
	}
	body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	t.Fatalf("waiting for %s (%s): last error %v; the page says:\n%s", what, expr, err, body)
}

// text is the text of the element sel, read in one evaluation in the
// page: the live updates swap parts of the page in at any moment, and
// chromedp.Text, which finds the node and then asks for its text, failed
// when the node was replaced in between ("No node with given id found").
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	const missing = "\x00missing"
	expr := `(() => { const e = document.querySelector(` + strconv.Quote(sel) + `); return e ? e.innerText : ` + strconv.Quote(missing) + ` })()`
	var s string
	var err error
	if !testutil.Within(time.Minute, func() bool { // a hang guard: the element may not be rendered yet
		s, err = chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		return err == nil && s != missing
	}) {
		t.Fatalf("text of %s: %v (no such element)", sel, err)
	}
	return s
}

// screenshot saves the page as name.png among the test's artifacts.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(t.ArtifactDir(), name+".png")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}

func TestDashboardInBrowser(t *testing.T) {
	testservers.Chromium(t) // fail first when there is no browser
	f := newFleet(t)
	srv, ctx := dashboard(t, f.store)

	// Overview: counts per state.
	do(t, ctx, "open the overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#count-all")))
	for sel, want := range map[string]string{"#count-pending": "1", "#count-running": "1", "#count-succeeded": "2",
		"#count-failed": "1", "#count-cancelled": "1", "#count-all": "6", "#throughput": "3", "#failure-rate": "33.3%"} {
		if got := text(t, ctx, sel); got != want {
			t.Errorf("overview %s = %q, want %q", sel, got, want)
		}
	}
	screenshot(t, ctx, "overview")

	// Task list, filtered to the failed tasks through the form.
	do(t, ctx, "filter the task list",
		chromedp.Navigate(srv.URL+"/tasks"), chromedp.WaitVisible(chromedp.CSS("#f-state")),
		chromedp.SetValue(chromedp.CSS("#f-state"), "failed"), chromedp.Click(chromedp.CSS("#f-apply")))
	waitFor(t, ctx, "the filtered list", `new URLSearchParams(location.search).get("state") === "failed" && document.readyState === "complete"`)
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#task-list tbody tr").length`)); err != nil || n != 1 {
		t.Errorf("state=failed lists %d rows (%v), want 1", n, err)
	}

	// The failed task's page shows the attempt's error; retry it, now
	// that the handler succeeds, and see it succeed.
	do(t, ctx, "open the failed task", chromedp.Click(chromedp.CSS(`a[href="/task?key=flash-3"]`)))
	waitFor(t, ctx, "the failed task's page", `location.pathname === "/task" && !!document.querySelector("#retry")`)
	if got := text(t, ctx, "#attempts"); !strings.Contains(got, "flaky: the device said no") || !strings.Contains(got, "worker-1") {
		t.Errorf("attempts of the failed task:\n%s\nwant its error and worker", got)
	}
	f.failing.Store(false)
	do(t, ctx, "retry", chromedp.Click(chromedp.CSS("#retry")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	f.await(t, "flash-3", task.StateSucceeded)
	waitFor(t, ctx, "the retried task shown succeeded", `document.querySelector("#task-state").textContent === "succeeded"`)

	// Cancel the running task: its handler stops.
	do(t, ctx, "open the running task", chromedp.Navigate(srv.URL+"/task?key=upload-7"),
		chromedp.WaitVisible(chromedp.CSS("#cancel")))
	if got := text(t, ctx, "#task-state"); got != "running" {
		t.Errorf("upload-7 shown %q, want running", got)
	}
	screenshot(t, ctx, "task-running")
	do(t, ctx, "cancel", chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	select {
	case cause := <-f.stopped:
		if !errors.Is(cause, task.ErrCancelled) {
			t.Errorf("the cancelled handler stopped with %v, want task.ErrCancelled", cause)
		}
	case <-t.Context().Done():
		t.Fatal("the cancelled task's handler never stopped")
	}
	waitFor(t, ctx, "the task shown cancelled", `document.querySelector("#task-state").textContent === "cancelled"`)

	// Bulk: tick every cancelled task and retry them.
	do(t, ctx, "list the cancelled tasks and retry them all", chromedp.Navigate(srv.URL+"/tasks?state=cancelled"),
		chromedp.WaitVisible(chromedp.CSS(`#task-list tr[data-key="stale-4"]`)),
		chromedp.Click(chromedp.CSS("#select-all")), chromedp.Click(chromedp.CSS("#bulk-retry")))
	waitFor(t, ctx, "the bulk retry's message", `(document.querySelector("#flash") || {}).textContent === "retried 2, skipped 0"`)
	for _, key := range []string{"stale-4", "upload-7"} {
		if got, err := f.store.Get(t.Context(), key); err != nil || got.State.Finished() {
			t.Errorf("%s after the bulk retry: %v %v, want it unfinished", key, got.State, err)
		}
	}

	// A live update: a task published while the list is open appears
	// without the page being loaded again.
	do(t, ctx, "open the task list", chromedp.Navigate(srv.URL+"/tasks"),
		chromedp.WaitVisible(chromedp.CSS("#task-list")))
	// Connected to the event stream, the page no longer polls: what
	// follows arrives over SSE.
	waitFor(t, ctx, "the event stream", `document.body.dataset.live === "connected"`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.sameLoad = true`)); err != nil {
		t.Fatal(err)
	}
	f.publish(t, "live-1", "quick", task.Options{})
	waitFor(t, ctx, "live-1 in the list", `!!document.querySelector('#task-list tr[data-key="live-1"]')`)
	if same, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.sameLoad === true`)); err != nil || !same {
		t.Errorf("the page was loaded again (%v): want a live update in place", err)
	}
	waitFor(t, ctx, "live-1 shown succeeded", `document.querySelector('#task-list tr[data-key="live-1"] .state').textContent === "succeeded"`)
	screenshot(t, ctx, "tasks")

	// The workers page: the consumer's registration and the task it runs
	// again since the bulk retry.
	f.await(t, "upload-7", task.StateRunning)
	do(t, ctx, "open the workers page", chromedp.Navigate(srv.URL+"/workers"), chromedp.WaitVisible(chromedp.CSS("#workers")))
	if got := text(t, ctx, "#workers tbody"); !strings.Contains(got, "worker-1") || !strings.Contains(got, "live") ||
		!strings.Contains(got, "upload-7") || !strings.Contains(got, "flaky") {
		t.Errorf("workers page:\n%s\nwant worker-1, live, its kinds and upload-7 running", got)
	}
	screenshot(t, ctx, "workers")
}
