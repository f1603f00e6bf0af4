package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// largeFanOut is the flow of flow.MaxSteps steps: a root fanning out to
// 99 steps, each fanning out to 100 leaves (1 + 99 + 9,900 = 10,000),
// every step a builtin sleep of a few milliseconds with retries enough
// for a loaded machine's lost leases.
func largeFanOut(key string) flow.Spec {
	retries := 30
	act := flow.Action{Kind: "sleep", Payload: []byte(`{"duration":"3ms"}`), Retries: &retries}
	spec := flow.Spec{Key: key, Params: []byte(`{"fleet":"all"}`), Steps: []flow.Step{{Name: "root", Action: act}}}
	for m := range 99 {
		spec.Steps = append(spec.Steps, flow.Step{Name: fmt.Sprintf("m%02d", m), Needs: []string{"root"}, Action: act})
	}
	for m := range 99 {
		for l := range 100 {
			spec.Steps = append(spec.Steps, flow.Step{Name: fmt.Sprintf("l%02d-%02d", m, l), Needs: []string{fmt.Sprintf("m%02d", m)}, Action: act})
		}
	}
	return spec
}

// TestFlowTenThousandSteps runs a 10,000-step fan-out flow on three
// `leasepool worker` processes sharing one embedded store, SIGKILLs one
// of them once a fifth of the steps succeeded, and checks the flow
// succeeded with every step's work recorded once (each a place of its
// own in completion order, its one task succeeded, its result kept) and
// no part of the flow's storage left unnamed. It then times the flow page
// of a `leasepool serve` process and `leasepool flow show`, and logs the
// figures docs/performance.md quotes (go test -v).
func TestFlowTenThousandSteps(t *testing.T) {
	const concurrency = 16
	ctx := testContext(t, 10*time.Minute)
	store, storeURL := openTestStore(t, ctx)
	spec := largeFanOut("fleet-10k")
	if len(spec.Steps) != flow.MaxSteps {
		t.Fatalf("%d steps; want flow.MaxSteps", len(spec.Steps))
	}
	start := time.Now()
	if _, _, err := flow.Publish(ctx, store, spec); err != nil {
		t.Fatal(err)
	}
	published := time.Since(start)
	workers := map[string]*workerProc{}
	for _, id := range []string{"w1", "w2", "w3"} {
		workers[id] = startPlainWorker(t, storeURL, id, "--concurrency", fmt.Sprint(concurrency))
	}
	succeeded := func() (int, *flow.Flow) {
		f, err := flow.Get(ctx, store, spec.Key)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range f.Progress {
			if p.Do.State == flow.RunSucceeded {
				n++
			}
		}
		return n, f
	}
	testutil.EventuallyEvery(t, 5*time.Minute, 200*time.Millisecond, "a fifth of the steps to succeed", func() bool {
		n, _ := succeeded()
		return n >= flow.MaxSteps/5
	})
	workers["w2"].kill(t)
	killedAt, _ := succeeded()
	var f *flow.Flow
	testutil.EventuallyEvery(t, 8*time.Minute, 200*time.Millisecond, "the flow to finish", func() bool {
		_, f = succeeded()
		return f.State.Finished()
	})
	took := time.Since(start)
	if f.State != flow.StateSucceeded {
		t.Fatalf("flow %s: %s; events %+v", f.State, f.Error, f.Events)
	}

	// Every step's work recorded once: its own place in completion order.
	order := make([]bool, len(f.Steps)+1)
	again := 0
	for i, p := range f.Progress {
		name := f.Steps[i].Name
		if p.State != flow.StepSucceeded || p.Do.State != flow.RunSucceeded {
			t.Fatalf("step %s: %s", name, p.State)
		}
		if p.Order < 1 || p.Order > len(f.Steps) || order[p.Order] {
			t.Fatalf("step %s ended at place %d, taken or out of range", name, p.Order)
		}
		order[p.Order] = true
		if _, ok := f.Params[name]; !ok {
			t.Fatalf("step %s: no result in the shared parameters", name)
		}
		if p.Do.Attempts > 1 {
			again++
		}
	}
	// One task per step, each succeeded, and none else under the key.
	tasks := map[string]*task.Task{}
	q := task.ListQuery{KeyPrefix: spec.Key + "/", Limit: 1000}
	for {
		page, err := store.List(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range page {
			tasks[tk.Key] = tk
		}
		if len(page) < q.Limit {
			break
		}
		q.AfterSeq = page[len(page)-1].Seq
	}
	if len(tasks) != len(f.Steps) {
		t.Errorf("%d step tasks; want %d", len(tasks), len(f.Steps))
	}
	for i, st := range f.Steps {
		if tk := tasks[flow.StepKey(spec.Key, 1, i, st.Name, false)]; tk == nil || tk.State != task.StateSucceeded {
			t.Fatalf("step %s: task %v", st.Name, tk)
		}
	}
	// No part of a write that lost, or that a write replaced, is left.
	head, err := store.GetDocument(ctx, flow.Namespace, spec.Key)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := store.Documents(ctx, flow.PartNamespace)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Split struct {
			Token string   `json:"token"`
			Spec  []int    `json:"spec"`
			Parts []string `json:"parts"`
		} `json:"split"`
	}
	if err := json.Unmarshal(head.Value, &h); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for n := range h.Split.Spec {
		want[fmt.Sprintf("%s~%s~s%d", spec.Key, h.Split.Token, n)] = true
	}
	for n, sfx := range h.Split.Parts {
		if sfx != "" {
			want[fmt.Sprintf("%s~%s~p%d~%s", spec.Key, h.Split.Token, n, sfx)] = true
		}
	}
	orphans := 0
	for _, p := range parts {
		if !want[p.ID] {
			orphans++ // a write of the killed worker's, or a delete not done yet
		}
		delete(want, p.ID)
	}
	if len(want) > 0 || len(head.Value) > task.MaxDocumentSize/8 {
		t.Errorf("parts named but not stored: %v; flow document of %d bytes", want, len(head.Value))
	}
	if orphans > 100 {
		t.Errorf("%d parts stored that the flow does not name", orphans)
	}

	// The page and flow show, at 10,000 steps.
	addr := startPlainServe(t, storeURL)
	get := func(path string) (time.Duration, int, string) {
		t0 := time.Now()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %.300s", path, resp.StatusCode, b)
		}
		return time.Since(t0), len(b), string(b)
	}
	cold, _, _ := get("/flow?key=" + spec.Key)
	best, size := time.Hour, 0
	var body string
	for range 5 {
		d, n, b := get("/flow?key=" + spec.Key)
		best, size, body = min(best, d), n, b
	}
	if !strings.Contains(body, `<span class="r-succeeded">9900 succeeded</span>`) || strings.Count(body, "<tr") > 80 {
		t.Errorf("the page does not show level 3's count, or shows more than a page: %.3000s", body)
	}
	if limit := pageLimit(); best > limit {
		t.Errorf("flow page of 10,000 steps took %s; want at most %s", best, limit)
	}
	levelTime, levelSize, deep := get("/flow?key=" + spec.Key + "&level=3&page=198")
	if !strings.Contains(deep, "steps 9851 to 9900 of 9900") || !strings.Contains(deep, `id="flow-level-prev"`) {
		t.Errorf("level 3's last page does not say which steps it shows, or links no page before")
	}
	t0 := time.Now()
	cmd := exec.Command(plainLeasepoolBin(t), "--store", storeURL, "flow", "show", spec.Key)
	var outb, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &outb, &errb
	code := 0
	if err := cmd.Run(); err != nil {
		code = -1
	}
	out, stderr := outb.String(), errb.String()
	show := time.Since(t0)
	if code != 0 || !strings.Contains(out, "level 3: 9900 steps: 9900 succeeded") || strings.Count(out, "\n") > 120 {
		t.Errorf("flow show: exit %d, %d lines:\n%.3000s\n%s", code, strings.Count(out, "\n"), out, stderr)
	}
	t.Logf("10,000-step flow: publish %s, run %s (w2 SIGKILLed at %d steps succeeded; %d steps ran twice); "+
		"flow page %d bytes in %s (first, cold %s; level 3's last page %d bytes in %s); flow show %d bytes in %s; %d parts left by the kill",
		published.Round(time.Millisecond), took.Round(time.Millisecond), killedAt, again, size, best.Round(time.Millisecond),
		cold.Round(time.Millisecond), levelSize, levelTime.Round(time.Millisecond), len(out), show.Round(time.Millisecond), orphans)

	// Deleting the stopped flow deletes its parts, orphans included.
	if n, err := flow.DeleteStopped(ctx, store, time.Now().Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("DeleteStopped = %d, %v", n, err)
	}
	if parts, err := store.Documents(ctx, flow.PartNamespace); err != nil || len(parts) != 0 {
		t.Errorf("%d parts left after the flow was deleted (%v)", len(parts), err)
	}
}

// pageLimit is the flow page's bound: 500 ms, or LEASEPOOL_TEST_PAGE_LIMIT
// (a duration) on a slower machine.
func pageLimit() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("LEASEPOOL_TEST_PAGE_LIMIT")); err == nil {
		return d
	}
	return 500 * time.Millisecond
}

// startPlainWorker is startWorker with plainLeasepoolBin's build.
func startPlainWorker(t *testing.T, store, id string, extra ...string) *workerProc {
	t.Helper()
	args := append([]string{"--store", store, "--log-level", "warn", "worker", "--id", id}, extra...)
	return startProc(t, id, exec.Command(plainLeasepoolBin(t), args...))
}

// startPlainServe runs plainBin's `leasepool serve` and returns its address
// once it answers.
func startPlainServe(t *testing.T, storeURL string) string {
	t.Helper()
	addr := freeAddr(t)
	startProc(t, "serve", exec.Command(plainLeasepoolBin(t), "--store", storeURL, "--log-level", "warn", "serve", "--listen", addr))
	testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "serve to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}
