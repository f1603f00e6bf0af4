package web_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

func (e *env) batch(path, body string, code int) web.BatchResponse {
	e.t.Helper()
	got, out := e.do("POST", path, body)
	if got != code {
		e.t.Fatalf("POST %s: %d %s; want %d", path, got, out, code)
	}
	var resp web.BatchResponse
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		e.t.Fatalf("POST %s: %v in %s", path, err, out)
	}
	return resp
}

// TestPublishBatch: a mixed batch is answered item by item in order; the
// refused items name tasks[i].field and are not stored, the others are.
func TestPublishBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("POST", "/api/v1/tasks", `{"key":"old","kind":"noop"}`, 201, `"inserted"`)
	deep := strings.Repeat("[", task.MaxJSONDepth+5) + strings.Repeat("]", task.MaxJSONDepth+5)
	body := `{"tasks":[
		{"key":"a","kind":"noop","payload":{"n":1}},
		{"key":"a","kind":"noop","payload":{"n":2}},
		{"key":"old","kind":"noop"},
		{"key":"b","kind":""},
		{"key":"c","kind":"noop","priority":"high"},
		{"key":"d","kind":"noop","colour":"red"},
		{"key":"e","kind":"noop","payload":` + deep + `},
		{"key":"f","kind":"noop","delay":"-1s"},
		{"key":"g","kind":"noop","lock_keys":["l1"]},
		"not an object",
		{"key":"/x","kind":"noop"}
	]}`
	resp := e.batch("/api/v1/tasks/batch", body, 200)
	want := []struct{ result, prefix string }{
		{"inserted", ""}, {"existing", ""}, {"existing", ""},
		{"refused", "tasks[3].kind: "}, {"refused", "tasks[4].priority: "}, {"refused", `tasks[5]: want one JSON object: json: unknown field "colour"`},
		{"refused", "tasks[6].payload: "}, {"refused", "tasks[7].delay: must not be negative"},
		{"inserted", ""}, {"refused", "tasks[9]: "}, {"refused", "tasks[10].key: "},
	}
	if len(resp.Results) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(resp.Results), len(want), resp.Results)
	}
	for i, w := range want {
		got := resp.Results[i]
		if got.Result != w.result || !strings.HasPrefix(got.Error, w.prefix) || (w.prefix == "") != (got.Error == "") || strings.Contains(got.Error, "\n") {
			t.Errorf("results[%d] = %+v; want %s %q", i, got, w.result, w.prefix)
		}
	}
	if resp.Inserted != 2 || resp.Existing != 2 || resp.Refused != 7 || resp.Failed != 0 {
		t.Errorf("counts %+v; want 2 inserted, 2 existing, 7 refused", resp)
	}
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "noop") {
		t.Errorf("warnings %q; want one about kind noop (no live worker)", resp.Warnings)
	}
	if got, err := e.store.Get(t.Context(), "a"); err != nil || string(got.Payload) != `{"n":1}` {
		t.Errorf("a: %v %v; want the first item's payload", got, err)
	}
	for _, k := range []string{"b", "c", "d", "e", "f"} {
		if _, err := e.store.Get(t.Context(), k); !errors.Is(err, task.ErrNotFound) {
			t.Errorf("refused %s: Get = %v; want not found (nothing written)", k, err)
		}
	}

	// ?strict=true refuses the kinds no live worker runs, item by item.
	resp = e.batch("/api/v1/tasks/batch?strict=true", `{"tasks":[{"key":"s1","kind":"noop"},{"key":"s2","kind":"x","lock_keys":[""]}]}`, 200)
	if r := resp.Results; r[0].Result != "refused" || !strings.HasPrefix(r[0].Error, "tasks[0].kind: ") || !strings.HasPrefix(r[1].Error, "tasks[1].lock_keys: ") {
		t.Errorf("strict: %+v", r)
	}
	if _, err := e.store.Get(t.Context(), "s1"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("strict refusal stored s1: %v", err)
	}
}

// TestPublishBatchOneKey: 10,000 items of one key make one task.
func TestPublishBatchOneKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	items := make([]string, web.MaxBatchTasks)
	for i := range items {
		items[i] = fmt.Sprintf(`{"key":"same","kind":"noop","payload":{"i":%d}}`, i)
	}
	resp := e.batch("/api/v1/tasks/batch", `{"tasks":[`+strings.Join(items, ",")+`]}`, 200)
	if resp.Inserted != 1 || resp.Existing != web.MaxBatchTasks-1 || resp.Results[0].Result != "inserted" {
		t.Fatalf("counts: %d inserted, %d existing, first %+v", resp.Inserted, resp.Existing, resp.Results[0])
	}
	if got, err := e.store.Get(t.Context(), "same"); err != nil || string(got.Payload) != `{"i":0}` || got.Version != 1 {
		t.Fatalf("same: %+v %v", got, err)
	}
}

// endless is a body that never ends: the batch's opening, then one
// payload string forever.
type endless struct{ started bool }

func (r *endless) Read(p []byte) (int, error) {
	if !r.started {
		r.started = true
		return copy(p, `{"tasks":[{"key":"k","kind":"noop","payload":"`), nil
	}
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestPublishBatchLimits: too many tasks or bytes is 413 naming the limit,
// malformed bodies 400, each with nothing written.
func TestPublishBatchLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	before := e.tasks()
	many := strings.Repeat(`{"key":"k","kind":"noop"},`, web.MaxBatchTasks) + `{"key":"k2","kind":"noop"}`
	e.want("POST", "/api/v1/tasks/batch", `{"tasks":[`+many+`]}`, 413, fmt.Sprintf("tasks: more than %d tasks in one request", web.MaxBatchTasks))
	for body, sub := range map[string]string{
		`{"tasks":[]}`:                                   "tasks: want at least one task",
		`[{"key":"k","kind":"noop"}]`:                    `body: want {\"tasks\": [...]}`,
		`{"items":[]}`:                                   `got field \"items\"`,
		`{"tasks":[{"key":"k","kind":"noop"}]} {}`:       "got more after it",
		`{"tasks":[{"key":"k","kind":"noop"}`:            "body: ",
		`{"tasks":[` + strings.Repeat("[", 20000) + `]}`: "body: ",
	} {
		e.want("POST", "/api/v1/tasks/batch", body, 400, sub)
	}
	// A body that never ends is cut at the byte bound.
	h, err := web.NewHandler(web.Config{Token: token, Store: e.store})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequestWithContext(t.Context(), "POST", "/api/v1/tasks/batch", io.NopCloser(&endless{}))
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), fmt.Sprintf("larger than %d bytes", web.MaxBatchBody)) {
		t.Errorf("endless body: %d %s; want 413 naming %d bytes", rec.Code, rec.Body, web.MaxBatchBody)
	}
	if after := e.tasks(); after != before {
		t.Errorf("refused batches wrote:\nbefore %s\nafter  %s", before, after)
	}
}

// TestPublishDebounce: a publish body's debounce replaces a pending
// task's payload (200 debounced), in a batch too, counted apart.
func TestPublishDebounce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("POST", "/api/v1/tasks", `{"key":"a","kind":"noop","payload":{"n":1},"debounce":"1m"}`, 201, `"inserted"`)
	e.want("POST", "/api/v1/tasks", `{"key":"a","kind":"noop","payload":{"n":2},"debounce":"1m"}`, 200, `"debounced"`)
	resp := e.batch("/api/v1/tasks/batch", `{"tasks":[
		{"key":"a","kind":"noop","payload":{"n":3},"debounce":"1m"},
		{"key":"a","kind":"noop","payload":{"n":4},"debounce":"30s"},
		{"key":"a","kind":"noop","payload":{"n":5}},
		{"key":"a","kind":"noop","payload":{"n":6},"debounce":"0s"}
	]}`, 200)
	if resp.Debounced != 2 || resp.Existing != 1 || resp.Refused != 1 || resp.Results[3].Error != "tasks[3].debounce: (0s) must be positive" {
		t.Fatalf("batch: %+v", resp)
	}
	got, err := e.store.Get(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Payload) != `{"n":4}` {
		t.Errorf("payload %s; want the last debounce's", got.Payload)
	}
}
