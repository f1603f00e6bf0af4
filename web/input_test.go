package web_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

func deepJSON(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// errorBody is the JSON answer of a refused request with its message.
func errorBody(msg string) string {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return string(b)
}

// storeDump is every document of st, tasks and leasepool's own, and every
// control, as JSON.
func storeDump(t *testing.T, st task.Store) string {
	t.Helper()
	var all []*task.Task
	for _, reserved := range []bool{false, true} {
		l, err := st.List(t.Context(), task.ListQuery{Reserved: reserved})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, l...)
	}
	cs, err := control.Load(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal([]any{all, cs.Pauses, cs.Limits})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHostilePublishBodies: input that must never be stored is refused with
// 400 and a message naming the field, and nothing is written.
func TestHostilePublishBodies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	before := storeDump(t, e.store)
	for _, c := range []struct{ path, body, msg string }{
		{"/api/v1/tasks", `{"key":"leasepool:control","kind":"leasepool.control","rerun":true}`,
			`key: "leasepool:control" is reserved (the leasepool: prefix is leasepool's own)`},
		{"/api/v1/tasks", `{"key":"leasepool:flow:x","kind":"leasepool.flow","payload":{"steps":7}}`,
			`key: "leasepool:flow:x" is reserved (the leasepool: prefix is leasepool's own)`},
		{"/api/v1/flows", `{"key":"leasepool:x","steps":[{"name":"a","kind":"noop"}]}`,
			`key: "leasepool:x" is reserved (the leasepool: prefix is leasepool's own)`},
		{"/api/v1/tasks/bulk", `{"action":"retry","keys":["a","leasepool:control"]}`,
			`keys: "leasepool:control" is reserved (the leasepool: prefix is leasepool's own)`},
		// Nesting: 1,001 levels broke SQLite's JSON functions; 65 is one past the limit.
		{"/api/v1/tasks", `{"key":"d","kind":"k","payload":` + deepJSON(1001) + `}`, "payload: nested deeper than 64 levels"},
		{"/api/v1/tasks", `{"key":"d","kind":"k","payload":` + deepJSON(65) + `}`, "payload: nested deeper than 64 levels"},
		{"/api/v1/tasks", `{"key":"d","kind":"k","payload":` + deepJSON(10000) + `}`, "payload: nested deeper than 64 levels"},
		{"/api/v1/flows", `{"key":"f","params":{"p":` + deepJSON(64) + `},"steps":[{"name":"a","kind":"noop"}]}`,
			"params: nested deeper than 64 levels"},
		{"/api/v1/flows", `{"key":"f","steps":[{"name":"a","kind":"noop","payload":` + deepJSON(65) + `}]}`,
			"steps[0].payload: nested deeper than 64 levels"},
		{"/api/v1/flows", `{"key":"f","steps":[{"name":"a","kind":"noop","rollback":{"kind":"noop","payload":` + deepJSON(65) + `}}]}`,
			"steps[0].rollback.payload: nested deeper than 64 levels"},
		{"/api/v1/flows", `{"key":"f","steps":[{"name":"a","kind":"noop","payload":` + deepJSON(5000) + `}]}`,
			"steps: nested deeper than 64 levels"},
		{"/api/v1/tasks/bulk", `{"action":"retry","filter":{"kind":` + deepJSON(100) + `}}`, "filter: nested deeper than 64 levels"},
		// Invalid UTF-8 is refused, never rewritten to U+FFFD.
		{"/api/v1/tasks", "{\"key\":\"a\xffb\",\"kind\":\"k\"}", "key: is not valid UTF-8"},
		{"/api/v1/tasks", "{\"key\":\"a\",\"kind\":\"k\xc3\"}", "kind: is not valid UTF-8"},
		{"/api/v1/tasks", "{\"key\":\"a\",\"kind\":\"k\",\"payload\":{\"s\":\"\xed\xa0\x80\"}}", "payload: is not valid UTF-8"},
		{"/api/v1/tasks", "{\"key\":\"a\",\"kind\":\"k\",\"lock_keys\":[\"x\xff\"]}", "lock_keys: is not valid UTF-8"},
		{"/api/v1/tasks", "{\"k\xffey\":\"a\",\"kind\":\"k\"}", "body: a field name is not valid UTF-8"},
		{"/api/v1/flows", "{\"key\":\"f\xff\",\"steps\":[{\"name\":\"a\",\"kind\":\"noop\"}]}", "key: is not valid UTF-8"},
		{"/api/v1/tasks/bulk", "{\"action\":\"retry\",\"keys\":[\"\xff\"]}", "keys: is not valid UTF-8"},
		{"/api/v1/pauses", "{\"scope\":\"kind\",\"name\":\"\xff\"}", "name: is not valid UTF-8"},
		// So is an escaped surrogate without its pair, which decodes to
		// U+FFFD: "a\ud800" and "a\udbff" would publish one key.
		{"/api/v1/tasks", `{"key":"a\ud800","kind":"k"}`, "key: is not valid UTF-8"},
		{"/api/v1/tasks", `{"key":"a\udbff","kind":"k"}`, "key: is not valid UTF-8"},
		{"/api/v1/flows", `{"key":"f","steps":[{"name":"a\udc00","kind":"noop"}]}`, "steps: is not valid UTF-8"},
		// Times outside 2000..2200.
		{"/api/v1/tasks", `{"key":"t","kind":"k","run_at":"9999-01-01T00:00:00Z"}`,
			"run_at: 9999-01-01T00:00:00Z is outside 2000-01-01 .. 2200-01-01"},
		{"/api/v1/tasks", `{"key":"t","kind":"k","run_at":"0001-01-02T00:00:00Z"}`,
			"run_at: 0001-01-02T00:00:00Z is outside 2000-01-01 .. 2200-01-01"},
		{"/api/v1/tasks", `{"key":"t","kind":"k","delay":"2000000h"}`, "delay: ends after 2200-01-01"},
		{"/api/v1/tasks", `{"key":"t","kind":"k","debounce":"0s"}`, "debounce: (0s) must be positive"},
		{"/api/v1/tasks", `{"key":"t","kind":"k","debounce":"-5s"}`, "debounce: (-5s) must be positive"},
		{"/api/v1/tasks", `{"key":"t","kind":"k","debounce":"25h"}`, "debounce: (25h0m0s) must be at most 24h0m0s"},
	} {
		e.want("POST", c.path, c.body, 400, errorBody(c.msg))
	}
	if after := storeDump(t, e.store); after != before {
		t.Errorf("refused requests wrote to the store:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := e.store.GetDocument(t.Context(), control.DoorbellNamespace, control.DoorbellID); err == nil {
		t.Error("the control doorbell exists after refused publishes")
	}

	// At the bounds: accepted, stored as given.
	e.want("POST", "/api/v1/tasks", `{"key":"d64","kind":"k","payload":`+deepJSON(64)+`}`, 201, `"key":"d64"`)
	e.want("POST", "/api/v1/tasks", `{"key":"t2199","kind":"k","run_at":"2199-12-31T00:00:00Z"}`, 201, `"run_at":"2199-12-31T00:00:00Z"`)
	e.want("POST", "/api/v1/flows", `{"key":"f64","params":{"p":`+deepJSON(63)+`},"steps":[{"name":"a","kind":"noop","payload":`+deepJSON(64)+`}]}`,
		201, `"key":"f64"`)
	// Stats never read nonsense for the far run_at: not ready, so no age.
	code, body := e.do("GET", "/api/v1/stats", "")
	if code == 200 && strings.Contains(body, "oldest_ready_at") {
		var st task.Stats
		if err := json.Unmarshal([]byte(body), &st); err != nil || st.OldestReadyAt.Before(time.Now().Add(-time.Hour)) || st.OldestReadyAt.After(time.Now().Add(time.Minute)) {
			t.Errorf("GET /api/v1/stats = %s; oldest_ready_at must be a ready task's (about now)", body)
		}
	}
}

// TestFilteredListsOverHostilePayloads: the filters SQLite answers with
// its JSON functions (created_*/updated_*, text= with < > & or non-ASCII)
// keep answering 200 over the deepest payloads stored.
func TestFilteredListsOverHostilePayloads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	payload := `{"t":"<b>&amp;é\u2028","n":` + deepJSON(task.MaxJSONDepth-1) + `}`
	e.want("POST", "/api/v1/tasks", `{"key":"deep","kind":"k","payload":`+payload+`}`, 201, `"key":"deep"`)
	e.want("POST", "/api/v1/flows", `{"key":"f","params":{"p":`+deepJSON(task.MaxJSONDepth-1)+`},"steps":[{"name":"a","kind":"noop"}]}`, 201, `"f"`)
	hour := url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	for _, q := range []string{
		"created_after=" + hour, "updated_after=" + hour, "created_before=2199-01-01T00:00:00Z",
		"text=" + url.QueryEscape("<b>"), "text=" + url.QueryEscape("&"), "text=" + url.QueryEscape("é"),
		"text=" + url.QueryEscape("<") + "&created_after=" + hour,
	} {
		e.want("GET", "/api/v1/tasks?"+q, "", 200, `"key":"deep"`)
		e.wantPage("/tasks?"+q, 200)
	}
	e.want("POST", "/api/v1/tasks/bulk", `{"action":"cancel","filter":{"text":"é"}}`, 200, `"ok":1`)
}

// TestMalformedFlowDocument: a flow document that does not decode (written
// by a store-level writer; callers cannot) is skipped by every list, not
// a 500 for good.
func TestMalformedFlowDocument(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.want("POST", "/api/v1/flows", twoSteps, 201, `"db-1"`)
	for _, key := range []string{"forged", "forged2"} {
		if _, err := e.store.PutDocument(task.WithInternalWrite(t.Context()), task.Document{Namespace: flow.Namespace, ID: key,
			Value: json.RawMessage(`{"steps":7,"progress":"x"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		var listed struct{ Flows []flow.Flow }
		out := e.want("GET", "/api/v1/flows", "", 200, `"db-1"`)
		if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed.Flows) != 1 {
			t.Errorf("GET /api/v1/flows = %s (%v); want db-1 only", out, err)
		}
		e.want("GET", "/api/v1/flows?active=true", "", 200, `"db-1"`)
		e.wantPage("/flows", 200, "db-1")
	}
	if n := task.MalformedCounts()[flow.Namespace]; n < 2 {
		t.Errorf("MalformedCounts()[%s] = %d; want each forged document counted", flow.Namespace, n)
	}
}
