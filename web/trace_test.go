package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

const (
	callerParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	callerState  = "vendor=a"
)

// postTraced sends a write with traceparent and tracestate headers and
// returns the status and body.
func (e *env) postTraced(path, body, traceparent, tracestate string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), "POST", e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.token)
	req.Header.Set("traceparent", traceparent)
	if tracestate != "" {
		req.Header.Set("tracestate", tracestate)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A publish, a batch publish and a flow publish keep the caller's trace
// context from its headers (tracing is off in this process: what is kept
// is the header's own); a bad header is refused naming it, nothing
// written; a remote worker's job carries the task's context.
func TestPublishKeepsTraceHeaders(t *testing.T) {
	e := newEnv(t, web.Config{Token: token})
	want := task.Trace{Traceparent: callerParent, Tracestate: callerState}
	if code, out := e.postTraced("/api/v1/tasks", `{"key":"one","kind":"k"}`, callerParent, callerState); code != 201 {
		t.Fatalf("publish: %d %s", code, out)
	}
	if code, out := e.postTraced("/api/v1/tasks/batch", `{"tasks":[{"key":"two","kind":"k"},{"key":"three","kind":"k"}]}`, callerParent, callerState); code != 200 {
		t.Fatalf("batch publish: %d %s", code, out)
	}
	for _, key := range []string{"one", "two", "three"} {
		if got := e.task(key).Trace; got != want {
			t.Errorf("%s: stored trace %+v; want %+v", key, got, want)
		}
	}
	if code, out := e.postTraced("/api/v1/flows", `{"key":"fl","steps":[{"name":"a","kind":"k"}]}`, callerParent, ""); code != 201 {
		t.Fatalf("flow publish: %d %s", code, out)
	}
	if got := e.task("fl/1/a/do").Trace; got.Traceparent != callerParent {
		t.Errorf("the flow's step task has trace %+v; want the flow's %s", got, callerParent)
	}

	for _, c := range []struct{ tp, ts, names string }{
		{"00-nothex-01", "", "traceparent header"},
		{callerParent, "not a list member", "tracestate header"},
	} {
		for _, path := range []string{"/api/v1/tasks", "/api/v1/tasks/batch", "/api/v1/flows"} {
			body := `{"key":"bad","kind":"k"}`
			switch path {
			case "/api/v1/tasks/batch":
				body = `{"tasks":[{"key":"bad","kind":"k"}]}`
			case "/api/v1/flows":
				body = `{"key":"bad","steps":[{"name":"a","kind":"k"}]}`
			}
			code, out := e.postTraced(path, body, c.tp, c.ts)
			if code != 400 || !strings.Contains(out, c.names) {
				t.Errorf("%s with traceparent %q tracestate %q: %d %s; want 400 naming %s", path, c.tp, c.ts, code, out, c.names)
			}
		}
		if _, err := e.store.Get(t.Context(), "bad"); err == nil {
			t.Fatalf("a refused publish wrote task bad")
		}
	}

	e.register("w1", "i1", "k")
	var jobs []struct {
		Key         string `json:"key"`
		Traceparent string `json:"traceparent"`
		Tracestate  string `json:"tracestate"`
	}
	out := e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","max":1,"wait_ms":1000}`, 200, `"jobs"`)
	var b struct{ Jobs json.RawMessage }
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b.Jobs, &jobs); err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || jobs[0].Traceparent != e.task(jobs[0].Key).Trace.Traceparent || jobs[0].Traceparent == "" {
		t.Fatalf("claimed %+v; want one job with its task's traceparent", jobs)
	}
	if jobs[0].Key != "fl/1/a/do" && jobs[0].Tracestate != callerState {
		t.Errorf("job %s has tracestate %q; want %q", jobs[0].Key, jobs[0].Tracestate, callerState)
	}
}
