package web_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

const token = "s3cret-token"

// env is an API server on a real SQLite store holding one schedule.
type env struct {
	t     *testing.T
	store task.Store
	srv   *httptest.Server
	token string
}

// tempStore opens an embedded store in t's temporary directory, closed
// when t ends.
func tempStore(t testing.TB) task.Store {
	t.Helper()
	s, err := store.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "s.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newEnv(t *testing.T, cfg web.Config) *env {
	t.Helper()
	s := tempStore(t)
	sch := schedule.Schedule{Name: "nightly", Every: task.Duration(time.Hour), CatchUp: schedule.DefaultCatchUp,
		Template: schedule.Template{Kind: "noop"}}
	if _, err := schedule.Add(t.Context(), s, sch, false); err != nil {
		t.Fatal(err)
	}
	cfg.Store = s
	h, err := web.NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &env{t: t, store: s, srv: srv, token: cfg.Token}
}

// do sends method path with body (none when empty) and the env's token,
// and returns the status and the body.
func (e *env) do(method, path, body string) (int, string) {
	e.t.Helper()
	return e.doAuth(method, path, body, "Bearer "+e.token)
}

func (e *env) doAuth(method, path, body, auth string) (int, string) {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	// Every JSON answer, error or not: never cached, never sniffed.
	if h := resp.Header; h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-store" {
		e.t.Errorf("%s %s: X-Content-Type-Options %q, Cache-Control %q; want nosniff, no-store",
			method, path, h.Get("X-Content-Type-Options"), h.Get("Cache-Control"))
	}
	return resp.StatusCode, string(b)
}

// want checks a response's status and that its body contains sub.
func (e *env) want(method, path, body string, code int, sub string) string {
	e.t.Helper()
	got, out := e.do(method, path, body)
	if got != code || !strings.Contains(out, sub) {
		e.t.Errorf("%s %s %s = %d %s, want %d containing %q", method, path, body, got, out, code, sub)
	}
	return out
}

// snapshot is everything the API can write: the controls, the schedules
// and whether the control doorbell was ever rung.
func (e *env) snapshot() string {
	e.t.Helper()
	st, err := control.Load(e.t.Context(), e.store)
	if err != nil {
		e.t.Fatal(err)
	}
	schs, err := schedule.List(e.t.Context(), e.store)
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = e.store.GetDocument(e.t.Context(), control.DoorbellNamespace, control.DoorbellID)
	b, _ := json.Marshal([]any{st.Pauses, st.Limits, schs, errors.Is(err, task.ErrNotFound)})
	return string(b)
}

func TestPauses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("GET", "/api/v1/pauses", "", 200, "[]")
	e.want("POST", "/api/v1/pauses", `{"scope":"lock","name":"device:pump-7"}`, 201, `{"changed":true}`)
	e.want("POST", "/api/v1/pauses", `{"scope":"lock","name":"device:pump-7"}`, 200, `{"changed":false}`)
	e.want("POST", "/api/v1/pauses", `{"scope":"all"}`, 201, `{"changed":true}`)
	ps, err := control.Pauses(t.Context(), e.store)
	if err != nil || len(ps) != 2 || ps[0].Target != control.All() || ps[1].Target != control.Lock("device:pump-7") {
		t.Fatalf("Pauses after POST = %+v, %v", ps, err)
	}
	var listed []control.PauseInfo
	if err := json.Unmarshal([]byte(e.want("GET", "/api/v1/pauses", "", 200, "")), &listed); err != nil || len(listed) != 2 || listed[1].Target.Name != "device:pump-7" {
		t.Errorf("GET pauses = %+v, %v", listed, err)
	}
	e.want("DELETE", "/api/v1/pauses?scope=all", "", 200, `{"changed":true}`)
	e.want("DELETE", "/api/v1/pauses?scope=all", "", 200, `{"changed":false}`)
	if ps, err := control.Pauses(t.Context(), e.store); err != nil || len(ps) != 1 || ps[0].Target != control.Lock("device:pump-7") {
		t.Errorf("Pauses after DELETE = %+v, %v", ps, err)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("GET", "/api/v1/limits", "", 200, "[]")
	e.want("PUT", "/api/v1/limits", `{"scope":"lock","name":"device:*","rate":"2/1s"}`, 200, `"per":"1s"`)
	e.want("PUT", "/api/v1/limits", `{"scope":"kind","name":"mail","rate":"10/m"}`, 200, `"n":10`)
	ls, err := control.Limits(t.Context(), e.store)
	if err != nil || len(ls) != 2 || ls[0] != (control.Limit{Target: control.Kind("mail"), N: 10, Per: time.Minute}) ||
		ls[1] != (control.Limit{Target: control.Lock("device:*"), N: 2, Per: time.Second}) {
		t.Fatalf("Limits after PUT = %+v, %v", ls, err)
	}
	e.want("GET", "/api/v1/limits", "", 200, `"name":"device:*"`)
	e.want("DELETE", "/api/v1/limits?scope=lock&name=device:*", "", 200, `{"changed":true}`)
	e.want("DELETE", "/api/v1/limits?scope=lock&name=device:*", "", 200, `{"changed":false}`)
	if ls, err := control.Limits(t.Context(), e.store); err != nil || len(ls) != 1 || ls[0].Target != control.Kind("mail") {
		t.Errorf("Limits after DELETE = %+v, %v", ls, err)
	}
}

// TestGroupLimits: a group's weight and concurrency over the API, the
// publish body's group, and bad input refused naming the field with
// nothing written; the Controls page shows them.
func TestGroupLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	for _, bad := range []struct{ body, field string }{
		{`{"scope":"group","name":"acme","weight":0}`, "weight"},
		{`{"scope":"group","name":"acme","weight":1001}`, "weight"},
		{`{"scope":"group","name":"acme","concurrency":0}`, "concurrency"},
		{`{"scope":"lock","name":"tenant:*","weight":2}`, "weight"},
		{`{"scope":"group","name":"ac\u0001me","weight":2}`, "name"},
	} {
		e.want("PUT", "/api/v1/limits", bad.body, 400, bad.field)
	}
	e.want("POST", "/api/v1/tasks", `{"key":"g","kind":"noop","group":"a\u0007b"}`, 400, "group")
	if ls, err := control.Limits(t.Context(), e.store); err != nil || len(ls) != 0 {
		t.Fatalf("limits after refused PUTs: %+v, %v", ls, err)
	}
	e.want("PUT", "/api/v1/limits", `{"scope":"group","name":"acme","weight":3}`, 200, `"weight":3`)
	e.want("PUT", "/api/v1/limits", `{"scope":"group","name":"acme","concurrency":5}`, 200, `"concurrency":5`)
	ls, err := control.Limits(t.Context(), e.store)
	if err != nil || len(ls) != 1 || ls[0] != (control.Limit{Target: control.Group("acme"), Weight: 3, Concurrency: 5}) {
		t.Fatalf("limits after PUTs: %+v, %v", ls, err)
	}
	e.want("POST", "/api/v1/tasks", `{"key":"g","kind":"noop","group":"acme"}`, 201, `"group":"acme"`)
	d := newEnv(t, web.Config{})
	if err := control.SetLimit(t.Context(), d.store, control.Limit{Target: control.Group("acme"), Weight: 3, Concurrency: 5}); err != nil {
		t.Fatal(err)
	}
	d.wantPage("/controls", 200, "group:acme", "<td>3</td><td>5</td>")
}

func TestSchedules(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("GET", "/api/v1/schedules", "", 200, `"name":"nightly"`)
	e.want("POST", "/api/v1/schedules/nightly/pause", "", 200, `"paused":true`)
	if sch, err := schedule.Get(t.Context(), e.store, "nightly"); err != nil || !sch.Paused {
		t.Fatalf("after pause: %+v, %v", sch, err)
	}
	e.want("POST", "/api/v1/schedules/nightly/resume", "", 200, `"name":"nightly"`)
	if sch, err := schedule.Get(t.Context(), e.store, "nightly"); err != nil || sch.Paused {
		t.Fatalf("after resume: %+v, %v", sch, err)
	}
	e.want("POST", "/api/v1/schedules/nope/pause", "", 404, "schedule not found")
}

// TestBadInput sends writes that must be refused with 400 naming the
// field, and checks the store did not change.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	before := e.snapshot()
	for _, c := range []struct{ method, path, body, field string }{
		{"POST", "/api/v1/pauses", `{"scope":"device","name":"x"}`, `scope: \"device\" is not one of`},
		{"POST", "/api/v1/pauses", `{"scope":"kind"}`, "name: kind: must not be empty"},
		{"POST", "/api/v1/pauses", `{"scope":"all","name":"x"}`, "name: scope all takes no name"},
		{"POST", "/api/v1/pauses", `{"scope":"all","extra":1}`, `body: want one JSON object: json: unknown field \"extra\"`},
		{"POST", "/api/v1/pauses", `{"scope":"all"} {}`, "body: want one JSON object"},
		{"POST", "/api/v1/pauses", `not json`, "body: "},
		{"POST", "/api/v1/pauses", ``, "body: "},
		{"DELETE", "/api/v1/pauses", "", `scope: \"\" is not one of`},
		{"DELETE", "/api/v1/pauses?scope=lock", "", "name: lock: must not be empty"},
		{"PUT", "/api/v1/limits", `{"scope":"kind","name":"mail","rate":"ten"}`, "rate: "},
		{"PUT", "/api/v1/limits", `{"scope":"kind","name":"mail","rate":"0/1s"}`, "rate: limit kind:mail: N must be 1 to"},
		{"PUT", "/api/v1/limits", `{"scope":"kind","name":"mail"}`, "rate: "},
		{"PUT", "/api/v1/limits", `{"scope":"all","rate":"2/1s"}`, "scope: a limit applies to a kind, a lock key or a group, not all"},
		{"PUT", "/api/v1/limits", `{"scope":"kind","rate":"2/1s"}`, "name: kind: must not be empty"},
		{"DELETE", "/api/v1/limits?scope=kind&name=", "", "name: kind: must not be empty"},
	} {
		e.want(c.method, c.path, c.body, 400, `{"error":"`+c.field)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("bad input changed the store:\nbefore %s\nafter  %s", before, after)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	before := e.snapshot()
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", token, "Basic " + token} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/api/v1/pauses", ""},
			{"POST", "/api/v1/pauses", `{"scope":"all"}`},
			{"GET", "/api/v1/nowhere", ""},
		} {
			if code, out := e.doAuth(r.method, r.path, r.body, auth); code != 401 || !strings.Contains(out, `"error":"missing or wrong bearer token`) {
				t.Errorf("%s %s with Authorization %q = %d %s, want 401", r.method, r.path, auth, code, out)
			}
		}
	}
	if after := e.snapshot(); after != before {
		t.Errorf("unauthorised requests changed the store:\nbefore %s\nafter  %s", before, after)
	}
	e.want("GET", "/api/v1/pauses", "", 200, "[]")
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{ReadOnly: true})
	before := e.snapshot()
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/api/v1/pauses", `{"scope":"all"}`},
		{"DELETE", "/api/v1/pauses?scope=all", ""},
		{"PUT", "/api/v1/limits", `{"scope":"kind","name":"mail","rate":"2/1s"}`},
		{"DELETE", "/api/v1/limits?scope=kind&name=mail", ""},
		{"POST", "/api/v1/schedules/nightly/pause", ""},
		{"POST", "/api/v1/schedules/nightly/resume", ""},
	} {
		e.want(r.method, r.path, r.body, 403, `{"error":"this server is read-only"}`)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("read-only server changed the store:\nbefore %s\nafter  %s", before, after)
	}
	e.want("GET", "/api/v1/pauses", "", 200, "[]")
	e.want("GET", "/api/v1/limits", "", 200, "[]")
	e.want("GET", "/api/v1/schedules", "", 200, "nightly")
}

func TestNotFoundAndMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.want("GET", "/api/v1/nowhere", "", 404, `{"error":"not found"}`)
	e.want("GET", "/nowhere", "", 404, `{"error":"not found"}`)
	e.want("GET", "/api/v1/schedules/nightly/pause", "", 405, `{"error":"method not allowed; allowed: POST"}`)
	e.want("PATCH", "/api/v1/pauses", "", 405, `"error":"method not allowed; allowed: `)
	e.want("POST", "/api/v1/limits", `{"scope":"kind","name":"mail","rate":"2/1s"}`, 405, "method not allowed")
	if ls, err := control.Limits(t.Context(), e.store); err != nil || len(ls) != 0 {
		t.Errorf("a 405 wrote limits %+v, %v", ls, err)
	}
}

func TestNewHandlerNeedsStore(t *testing.T) {
	t.Parallel()
	if _, err := web.NewHandler(web.Config{}); err == nil || !strings.Contains(err.Error(), "Store") {
		t.Errorf("NewHandler without a store = %v, want an error naming Store", err)
	}
}
