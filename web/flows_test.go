package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/web"
)

const twoSteps = `{"key":"db-1","params":{"cpu":4},"steps":[
 {"name":"check","kind":"noop","rollback":{"kind":"noop"}},
 {"name":"init","kind":"noop"}]}`

func TestFlowsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	if code, body := e.do("POST", "/api/v1/flows", twoSteps); code != http.StatusCreated || !strings.Contains(body, `"result":"inserted"`) {
		t.Fatalf("publish = %d %s, want 201 inserted", code, body)
	}
	if code, body := e.do("POST", "/api/v1/flows", twoSteps); code != http.StatusOK {
		t.Fatalf("publish again = %d %s, want 200 (idempotent by key)", code, body)
	}
	code, body := e.do("GET", "/api/v1/flows/db-1", "")
	var f flow.Flow
	if err := json.Unmarshal([]byte(body), &f); code != 200 || err != nil || f.State != flow.StateRunning || len(f.Steps) != 2 {
		t.Fatalf("get = %d %s (%v), want the running flow", code, body, err)
	}
	for path, want := range map[string]string{
		"/api/v1/flows":             `"key":"db-1"`,
		"/api/v1/flows?active=true": `"key":"db-1"`,
	} {
		if code, body := e.do("GET", path, ""); code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d %s, want %s", path, code, body, want)
		}
	}
	if code, body := e.do("POST", "/api/v1/flows/db-1/cancel?rollback=false", ""); code != 200 || !strings.Contains(body, `"state":"cancelled"`) {
		t.Fatalf("cancel = %d %s", code, body)
	}
	if code, _ := e.do("POST", "/api/v1/flows/db-1/cancel", ""); code != http.StatusConflict {
		t.Errorf("cancel of a cancelled flow = %d, want 409", code)
	}
	if code, body := e.do("POST", "/api/v1/flows/db-1/retry", ""); code != 200 || !strings.Contains(body, `"gen":2`) {
		t.Errorf("retry = %d %s, want run 2", code, body)
	}
	if code, _ := e.do("GET", "/api/v1/flows/nope", ""); code != http.StatusNotFound {
		t.Errorf("get unknown = %d, want 404", code)
	}
}

func TestFlowsAPIBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	for body, want := range map[string]string{
		`{"key":"x","stepz":[]}`:                       "stepz",
		`{"key":"x","steps":[]}`:                       "steps",
		`{"key":"x","steps":[{"name":"a","kind":""}]}`: "steps[0].kind",
		`{"key":"x","steps":[{"name":"a","kind":"device","payload":{"device":"d","command":"c","ack_timout":"1s"}}]}`: "steps[0].payload",
	} {
		code, got := e.do("POST", "/api/v1/flows", body)
		if code != http.StatusBadRequest || !strings.Contains(got, want) {
			t.Errorf("publish %s = %d %s, want 400 naming %s", body, code, got, want)
		}
	}
	if code, body := e.do("GET", "/api/v1/flows", ""); code != 200 || strings.Contains(body, `"key":"x"`) {
		t.Errorf("after bad publishes, flows = %d %s: want none written", code, body)
	}
	if code, _ := e.do("GET", "/api/v1/flows?active=maybe", ""); code != http.StatusBadRequest {
		t.Errorf("active=maybe = %d, want 400", code)
	}
	ro := newEnv(t, web.Config{ReadOnly: true})
	if code, _ := ro.do("POST", "/api/v1/flows", twoSteps); code != http.StatusForbidden {
		t.Errorf("read-only publish = %d, want 403", code)
	}
}

func TestDashboardFlows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	if code, body := e.do("POST", "/api/v1/flows", twoSteps); code != http.StatusCreated {
		t.Fatalf("publish = %d %s", code, body)
	}
	e.wantPage("/flows", 200, `data-key="db-1"`, ">running<")
	e.wantPage("/flow?key=db-1", 200, `id="flow-state" class="f-running">running<`, "check", "init", ">db-1/1/check/do<", `id="flow-cancel-rollback"`)
	e.wantPage("/flow?key=nope", 404, "flow not found")
	tok := e.csrf()
	sameOrigin := func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "same-origin") }
	form := url.Values{"key": {"db-1"}, "csrf": {tok}, "rollback": {"true"}}
	if code, loc := e.send("POST", "/flow/cancel", form, sameOrigin); code != 303 || !strings.HasPrefix(loc, "/flow?key=db-1&msg=") {
		t.Fatalf("cancel = %d %q, want 303 to the flow page", code, loc)
	}
	// Cancelled with rollback: the started first step is being undone.
	e.wantPage("/flow?key=db-1", 200, ">rolling_back<", ">db-1/1/check/undo<")
	if code, _ := e.send("POST", "/flow/retry", url.Values{"key": {"db-1"}, "csrf": {tok}}, sameOrigin); code != 303 {
		t.Errorf("retry of a moving flow = %d, want 303 back with the refusal", code)
	}
	e.wantPage("/flow?key=db-1", 200, ">rolling_back<")
}

// TestFlowSignalAPI: POST /api/v1/flows/{key}/signal/{step} ends a signal
// step's wait with the body as its payload; every refusal has its status.
func TestFlowSignalAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	const approval = `{"key":"vm-1","steps":[
 {"name":"approval","type":"signal","timeout":"24h"},
 {"name":"create","kind":"noop","needs":["approval"]},
 {"name":"ack","type":"signal","needs":["create"]}]}`
	if code, body := e.do("POST", "/api/v1/flows", approval); code != http.StatusCreated {
		t.Fatalf("publish = %d %s", code, body)
	}
	for _, tt := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/api/v1/flows/nope/signal/approval", "", http.StatusNotFound, "flow not found"},
		{"/api/v1/flows/vm-1/signal/nope", "", http.StatusNotFound, "flow step not found"},
		{"/api/v1/flows/vm-1/signal/create", "", http.StatusBadRequest, "not a signal step"},
		{"/api/v1/flows/vm-1/signal/approval", `{"by":`, http.StatusBadRequest, "payload"},
		{"/api/v1/flows/vm-1/signal/approval", ` {"by":"ann"}` + "\n", http.StatusOK, `"approval":{"by":"ann"}`},
		{"/api/v1/flows/vm-1/signal/approval", `{"by":"bob"}`, http.StatusConflict, "already signalled"},
		// A step not yet started keeps its signal; an empty body is null.
		{"/api/v1/flows/vm-1/signal/ack", "", http.StatusOK, `"signal":{"at":`},
		{"/api/v1/flows/vm-1/signal/ack", "", http.StatusConflict, "already signalled"},
	} {
		code, body := e.do("POST", tt.path, tt.body)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("POST %s %q = %d %s; want %d with %s", tt.path, tt.body, code, body, tt.code, tt.want)
		}
	}
	if code, body := e.do("POST", "/api/v1/flows/vm-1/cancel", ""); code != 200 {
		t.Fatalf("cancel = %d %s", code, body)
	}
	if code, body := e.do("POST", "/api/v1/flows/vm-1/signal/ack", ""); code != http.StatusConflict || !strings.Contains(body, "flow finished") {
		t.Errorf("signal to a cancelled flow = %d %s, want 409", code, body)
	}
	ro := newEnv(t, web.Config{ReadOnly: true})
	if code, _ := ro.do("POST", "/api/v1/flows/vm-1/signal/ack", ""); code != http.StatusForbidden {
		t.Errorf("read-only signal = %d, want 403", code)
	}
}

// A step that never started as a step it needs failed is skipped, with
// why, in the API's progress, the flow page's steps table and its box in
// the picture.
func TestFlowSkippedStepSaysWhy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: e.store}); err != nil {
		t.Fatal(err)
	}
	mux.RegisterFunc("ok", func(context.Context, *consumer.Job) error { return nil })
	mux.RegisterFunc("bad", func(context.Context, *consumer.Job) error { return errors.New("broke") })
	c, err := consumer.New(consumer.Config{Store: e.store, Handler: mux, WorkerID: "w", RetryPolicy: consumer.NoBackoff})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	e.want("POST", "/api/v1/flows", `{"key":"fleet","steps":[
 {"name":"u1","kind":"bad","retries":0},{"name":"u2","kind":"ok"},
 {"name":"v1","kind":"ok","needs":["u1"]},{"name":"v2","kind":"ok","needs":["u2"]},
 {"name":"all","kind":"ok","needs":["v1","v2"],"max_failed_needs":1}]}`, http.StatusCreated, `"result":"inserted"`)
	var f flow.Flow
	testutil.Eventually(t, time.Minute, "the flow to finish", func() bool {
		_, body := e.do("GET", "/api/v1/flows/fleet", "")
		if err := json.Unmarshal([]byte(body), &f); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return f.State.Finished()
	})
	if v1 := f.Progress[2]; f.State != flow.StateSucceeded || v1.State != flow.StepSkipped || v1.Reason != "needs u1, which failed" {
		t.Fatalf("flow %s, v1 %s because %q; want succeeded, v1 skipped because u1 failed", f.State, v1.State, v1.Reason)
	}
	body := e.wantPage("/flow?key=fleet", 200, `<td><span class="r-skipped">skipped</span><div class="note">needs u1, which failed</div></td>`,
		`data-step="v1" data-state="skipped"`, "skipped: needs u1, which failed</title>")
	if strings.Contains(body, `<span class="r-failed">failed</span><div class="err">needs u1`) {
		t.Errorf("the steps table shows the skipped step failed")
	}
}
