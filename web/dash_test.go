package web_test

// The dashboard over HTTP (no browser): pages, filters and paging, the
// forms' CSRF and cross-origin guards, read-only mode and basic auth.

import (
	b64 "encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// send sends method path with the request changed by edit (may be nil) and
// returns the status and body.
func (e *env) send(method, path string, form url.Values, edit func(*http.Request)) (int, string) {
	e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.srv.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if edit != nil {
		edit(req)
	}
	// Redirects are answers to check, not to follow.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode == http.StatusSeeOther {
		return resp.StatusCode, resp.Header.Get("Location")
	}
	return resp.StatusCode, string(b)
}

// wantPage checks GET path's status and that the body has every sub.
func (e *env) wantPage(path string, code int, subs ...string) string {
	e.t.Helper()
	got, body := e.send("GET", path, nil, nil)
	if got != code {
		e.t.Errorf("GET %s = %d, want %d; body:\n%s", path, got, code, body)
	}
	for _, s := range subs {
		if !strings.Contains(body, s) {
			e.t.Errorf("GET %s: body lacks %q:\n%s", path, s, body)
		}
	}
	return body
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf reads the form token from the task list.
func (e *env) csrf() string {
	e.t.Helper()
	m := csrfField.FindStringSubmatch(e.wantPage("/tasks", 200))
	if m == nil {
		e.t.Fatal("no csrf field on /tasks")
	}
	return m[1]
}

func (e *env) publish(key, kind, payload string) {
	e.t.Helper()
	if _, _, err := task.Publish(e.t.Context(), e.store, task.PublishParams{Key: key, Kind: kind, Payload: []byte(payload)}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) state(key string) task.State {
	e.t.Helper()
	t, err := e.store.Get(e.t.Context(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	return t.State
}

// rows are the task keys a list page shows, in order.
func rows(body string) []string {
	var keys []string
	for _, m := range regexp.MustCompile(`data-key="([^"]+)"`).FindAllStringSubmatch(body, -1) {
		keys = append(keys, m[1])
	}
	return keys
}

func TestDashboardPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.publish("mail/1", "mail", `{"to":"ana@example.com"}`)
	e.publish("mail/2", "mail", `{"to":"bo@example.com"}`)
	e.publish("sms/1", "sms", `{"to":"+100"}`)
	if _, err := task.Cancel(t.Context(), e.store, "sms/1"); err != nil {
		t.Fatal(err)
	}
	e.wantPage("/", 200, `id="count-pending">2<`, `id="count-cancelled">1<`, `id="count-all">3<`, `href="/tasks?kind=mail"`)
	e.wantPage("/task?key=mail%2F1", 200, `id="task-state">pending<`, "ana@example.com", `id="cancel"`)
	e.wantPage("/task?key=sms%2F1", 200, `id="task-state">cancelled<`, `id="retry"`)
	e.wantPage("/workers", 200, "no worker registered")
	e.wantPage("/devices", 200, "no device known")
	e.wantPage("/controls", 200, "nightly", "nothing paused")
	e.wantPage("/static/app.js", 200, "EventSource")

	for q, want := range map[string]string{
		"":                          "sms/1 mail/2 mail/1",
		"?state=pending":            "mail/2 mail/1",
		"?kind=sms":                 "sms/1",
		"?prefix=mail%2F":           "mail/2 mail/1",
		"?text=bo%40":               "mail/2",
		"?created_after=1h":         "sms/1 mail/2 mail/1",
		"?created_before=1h":        "",
		"?updated_after=2000-01-01": "sms/1 mail/2 mail/1",
		"?worker=nobody":            "",
	} {
		if got := strings.Join(rows(e.wantPage("/tasks"+q, 200)), " "); got != want {
			t.Errorf("/tasks%s lists %q, want %q", q, got, want)
		}
	}
	for q, field := range map[string]string{
		"?state=bogus":             "state: ",
		"?created_after=yesterday": "created_after: ",
		"?updated_before=x":        "updated_before: ",
		"?before=-3":               "before: ",
	} {
		e.wantPage("/tasks"+q, 400, `id="error">`+field)
	}
	e.wantPage("/task?key=nope", 404, "task not found")
	e.wantPage("/task", 400, "key: must not be empty")
}

func TestDashboardPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	for i := range 60 {
		e.publish(fmt.Sprintf("t%02d", i), "noop", "{}")
	}
	body := e.wantPage("/tasks", 200, `id="next-page"`)
	first := rows(body)
	if len(first) != 50 || first[0] != "t59" || first[49] != "t10" {
		t.Fatalf("first page: %d rows %v, want t59..t10", len(first), first)
	}
	next := regexp.MustCompile(`href="(/tasks\?before=\d+)" id="next-page"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatal("no next-page link")
	}
	e.publish("t60", "noop", "{}") // published while paging: not on the older page
	second := rows(e.wantPage(next[1], 200))
	if len(second) != 10 || second[0] != "t09" || second[9] != "t00" {
		t.Errorf("second page: %v, want t09..t00", second)
	}
}

func TestDashboardActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.publish("a", "noop", "{}")
	e.publish("b", "noop", "{}")
	e.publish("c", "noop", "{}")
	tok := e.csrf()
	form := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Add(kv[i], kv[i+1])
		}
		return v
	}
	// Refused: no token, a wrong one, a cross-site browser request (even
	// with the right token), a foreign Origin. Nothing changes.
	for name, c := range map[string]struct {
		form url.Values
		edit func(*http.Request)
	}{
		"no token":    {form("key", "a"), nil},
		"wrong token": {form("key", "a", "csrf", "00"+tok[2:]), nil},
		"cross-site":  {form("key", "a", "csrf", tok), func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }},
		"origin":      {form("key", "a", "csrf", tok), func(r *http.Request) { r.Header.Set("Origin", "https://evil.example") }},
	} {
		if code, _ := e.send("POST", "/task/cancel", c.form, c.edit); code != http.StatusForbidden {
			t.Errorf("%s: cancel = %d, want 403", name, code)
		}
	}
	if got := e.state("a"); got != task.StatePending {
		t.Fatalf("a refused cancel left a %s, want pending", got)
	}
	sameOrigin := func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "same-origin") }
	if code, loc := e.send("POST", "/task/cancel", form("key", "a", "csrf", tok), sameOrigin); code != 303 || loc != "/task?key=a&msg=cancelled" {
		t.Errorf("cancel = %d %q, want 303 to the task page", code, loc)
	}
	if e.state("a") != task.StateCancelled {
		t.Errorf("a is %s after cancel", e.state("a"))
	}
	code, loc := e.send("POST", "/tasks/bulk", form("action", "cancel", "key", "b", "key", "c", "key", "a", "csrf", tok, "back", "/tasks?state=pending"), nil)
	if code != 303 || loc != "/tasks?state=pending&msg=cancelled-2-1" {
		t.Errorf("bulk cancel = %d %q", code, loc)
	}
	code, loc = e.send("POST", "/tasks/bulk", form("action", "retry", "key", "a", "key", "b", "csrf", tok, "back", "//evil.example/"), nil)
	if code != 303 || loc != "/?msg=retried-2-0" {
		t.Errorf("bulk retry = %d %q (an off-site back must not be followed)", code, loc)
	}
	for _, back := range []string{`/\evil.example/`, `/./\evil.example/`, `/a/..\evil.example`, "https://evil.example/", "/\t/evil.example", "tasks"} {
		if code, loc := e.send("POST", "/tasks/bulk", form("action", "cancel", "key", "zz", "csrf", tok, "back", back), nil); code != 303 || !strings.HasPrefix(loc, "/?msg=") {
			t.Errorf("back %q: %d %q, want a redirect to / only", back, code, loc)
		}
	}
	if e.state("a") != task.StatePending || e.state("b") != task.StatePending || e.state("c") != task.StateCancelled {
		t.Errorf("after bulk: a %s b %s c %s, want pending pending cancelled", e.state("a"), e.state("b"), e.state("c"))
	}
	// leasepool's own documents are not tasks: not shown, not acted on.
	if code, _ := e.send("POST", "/task/cancel", form("key", "leasepool:control", "csrf", tok), nil); code != 404 {
		t.Errorf("cancel of a reserved key = %d, want 404", code)
	}
	e.wantPage("/task?key=leasepool%3Acontrol", 404, "not found")
	if code, body := e.send("POST", "/tasks/bulk", form("action", "delete", "key", "a", "csrf", tok), nil); code != 400 || !strings.Contains(body, "action: ") {
		t.Errorf("bulk delete = %d, want 400 naming action:\n%s", code, body)
	}

	// Pause and resume a kind, pause a schedule.
	if code, loc := e.send("POST", "/controls/pause", form("scope", "kind", "name", "mail", "csrf", tok), nil); code != 303 || loc != "/controls?msg=paused" {
		t.Errorf("pause = %d %q", code, loc)
	} else {
		e.wantPage(loc, 200, `id="flash">paused<`)
	}
	if ps, _ := control.Pauses(t.Context(), e.store); len(ps) != 1 || ps[0].Target != control.Kind("mail") {
		t.Errorf("pauses after the form: %+v", ps)
	}
	e.wantPage("/controls", 200, "kind:mail", `action="/controls/resume"`)
	if code, body := e.send("POST", "/controls/pause", form("scope", "lock", "csrf", tok), nil); code != 400 || !strings.Contains(body, "name: ") {
		t.Errorf("pause without a name = %d, want 400 naming name", code)
	}
	e.send("POST", "/controls/resume", form("scope", "kind", "name", "mail", "csrf", tok), nil)
	if ps, _ := control.Pauses(t.Context(), e.store); len(ps) != 0 {
		t.Errorf("pauses after resume: %+v", ps)
	}
	e.send("POST", "/controls/schedule", form("name", "nightly", "op", "pause", "csrf", tok), nil)
	e.wantPage("/controls", 200, "<td>paused</td>", `value="resume"`)
	if code, _ := e.send("POST", "/controls/schedule", form("name", "nope", "op", "pause", "csrf", tok), nil); code != 404 {
		t.Errorf("pause of an unknown schedule = %d, want 404", code)
	}
}

func TestDashboardReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{ReadOnly: true})
	e.publish("a", "noop", "{}")
	body := e.wantPage("/task?key=a", 200, "read-only")
	for _, s := range []string{`id="cancel"`, `id="retry"`, `action="/task/cancel"`} {
		if strings.Contains(body, s) {
			t.Errorf("read-only task page shows %s", s)
		}
	}
	if strings.Contains(e.wantPage("/controls", 200), `action="/controls/pause"`) {
		t.Error("read-only controls page shows the pause form")
	}
	tok := e.csrf()
	before := e.snapshot()
	for _, path := range []string{"/task/cancel", "/tasks/bulk", "/controls/pause", "/controls/schedule"} {
		v := url.Values{"key": {"a"}, "action": {"cancel"}, "scope": {"all"}, "name": {"nightly"}, "op": {"pause"}, "csrf": {tok}}
		if code, _ := e.send("POST", path, v, nil); code != http.StatusForbidden {
			t.Errorf("read-only POST %s = %d, want 403", path, code)
		}
	}
	if e.state("a") != task.StatePending || e.snapshot() != before {
		t.Error("a read-only server changed the store")
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{BasicUser: "ops", BasicPassword: "pw", Token: token})
	basic := func(user, pass string) func(*http.Request) {
		return func(r *http.Request) {
			r.Header.Set("Authorization", "Basic "+b64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
		}
	}
	for name, edit := range map[string]func(*http.Request){
		"none": nil, "wrong password": basic("ops", "pW"), "wrong user": basic("op", "pw"), "empty": basic("", ""),
		"password as token": func(r *http.Request) { r.Header.Set("Authorization", "Bearer pw") },
	} {
		for _, path := range []string{"/", "/tasks", "/api/v1/pauses", "/static/app.js"} {
			code, _ := e.send("GET", path, nil, edit)
			if code != http.StatusUnauthorized {
				t.Errorf("%s: GET %s = %d, want 401", name, path, code)
			}
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", e.srv.URL+"/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Basic ") {
		t.Errorf("WWW-Authenticate %q, want a Basic challenge so the browser asks", got)
	}
	if code, _ := e.send("GET", "/", nil, basic("ops", "pw")); code != 200 {
		t.Errorf("basic auth: GET / = %d, want 200", code)
	}
	e.want("GET", "/api/v1/pauses", "", 200, "[]") // the bearer token still works
	for _, cfg := range []web.Config{{BasicUser: "ops"}, {BasicPassword: "pw"}, {BasicUser: "a:b", BasicPassword: "pw"}} {
		cfg.Store = e.store
		if _, err := web.NewHandler(cfg); err == nil || !strings.Contains(err.Error(), "Basic") {
			t.Errorf("NewHandler(%+v) = %v, want an error naming Basic", cfg, err)
		}
	}
}

// TestDashboardStoreTime: pages say how old things are in store time.
func TestDashboardStoreTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.publish("later", "noop", "{}")
	if _, err := task.Modify(t.Context(), e.store, "later", func(tk *task.Task) error {
		tk.NextClaimAt = e.store.Now().Add(time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.wantPage("/tasks", 200, "in 1h0m0s", `id="task-list"`)
}

// TestDashboardDevices: the devices page joins the states the workers
// recorded with the device tasks: online state, running command and its
// holder, queued commands.
func TestDashboardDevices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	now := e.store.Now()
	if err := mqttdev.StoreStates(e.store).PutDeviceState(t.Context(), mqttdev.DeviceState{ID: "pump-7", Online: true, At: now, SeenAt: now}); err != nil {
		t.Fatal(err)
	}
	e.publish("cmd-1", mqttdev.Kind, `{"device":"pump-7","command":"flush"}`)
	e.publish("cmd-2", mqttdev.Kind, `{"device":"pump-7","command":"drain"}`)
	e.publish("cmd-3", mqttdev.Kind, `{"device":"valve-2","command":"open"}`)
	if _, err := task.Modify(t.Context(), e.store, "cmd-1", func(tk *task.Task) error {
		tk.Claim(task.Holder{WorkerID: "w-9", Instance: "i-1"}, e.store.Now())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	body := e.wantPage("/devices", 200, "pump-7", "online", "flush", `href="/task?key=cmd-1"`, "w-9 (#1)", "valve-2", "unknown")
	if !regexp.MustCompile(`data-device="pump-7"(?s:.*?)<td class="queued">1</td>`).MatchString(body) {
		t.Errorf("pump-7 should show 1 queued command:\n%s", body)
	}
	// The fleet view: counts by state, and each device's last commands,
	// newest first.
	for _, want := range []string{`id="fleet-online">1<`, `id="fleet-unknown">1<`, `id="fleet-states"`} {
		if !strings.Contains(body, want) {
			t.Errorf("devices page lacks %s", want)
		}
	}
	if !regexp.MustCompile(`data-device="pump-7"(?s:.*?)<ul class="cmds"><li><a href="/task\?key=cmd-2">drain</a>(?s:.*?)cmd-1">flush</a>`).MatchString(body) {
		t.Errorf("pump-7's last commands should be drain then flush:\n%s", body)
	}
}

// TestGuard: other handlers can sit behind the same login.
func TestGuard(t *testing.T) {
	t.Parallel()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h, err := web.Guard(web.Config{BasicUser: "ops", BasicPassword: "pw", Token: token}, ok)
	if err != nil {
		t.Fatal(err)
	}
	for auth, want := range map[string]int{
		"": 401, "Bearer " + token: 418, "Bearer nope": 401,
		"Basic " + b64.StdEncoding.EncodeToString([]byte("ops:pw")): 418,
		"Basic " + b64.StdEncoding.EncodeToString([]byte("ops:no")): 401,
	} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Authorization %q: %d, want %d", auth, w.Code, want)
		}
	}
	open, err := web.Guard(web.Config{}, ok)
	if err != nil {
		t.Fatal(err)
	}
	// With no credentials only loopback hosts are served; httptest's
	// requests name example.com.
	for host, want := range map[string]int{"127.0.0.1": 418, "localhost:8080": 418, "example.com": 421} {
		w, r := httptest.NewRecorder(), httptest.NewRequest("GET", "/metrics", nil)
		r.Host = host
		open.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("no credentials configured, Host %s: %d, want %d", host, w.Code, want)
		}
	}
	if _, err := web.Guard(web.Config{Token: "same", ReadToken: "same"}, ok); err == nil || !strings.Contains(err.Error(), "ReadToken") {
		t.Errorf("Guard with ReadToken == Token: err %v, want one naming ReadToken", err)
	}
}

// TestDashboardAttemptHistory: the task page lists every attempt kept,
// a released one and one before a retry included, with results and logs.
func TestDashboardAttemptHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.publish("job", "mail", `{}`)
	ctx := t.Context()
	step := func(fn func(tk *task.Task, now time.Time) error) {
		t.Helper()
		if _, err := task.Modify(ctx, e.store, "job", func(tk *task.Task) error { return fn(tk, e.store.Now()) }); err != nil {
			t.Fatal(err)
		}
	}
	w1 := task.Holder{WorkerID: "w-one", Instance: "i1"}
	w2 := task.Holder{WorkerID: "w-two", Instance: "i2"}
	var h1, h2 task.Holder
	step(func(tk *task.Task, now time.Time) error { h1 = tk.Claim(w1, now); return nil })
	step(func(tk *task.Task, now time.Time) error { return tk.Release(h1, now) })
	step(func(tk *task.Task, now time.Time) error { h2 = tk.Claim(w2, now); return nil })
	step(func(tk *task.Task, now time.Time) error {
		tk.Record(h2, task.Output{Result: json.RawMessage(`{"sent":3}`), Log: []task.LogLine{{At: now, Msg: "three mails out"}}})
		return tk.Succeed(h2, now)
	})
	e.wantPage("/task?key=job", 200, "w-one", "RELEASED", "w-two", "SUCCESS", "&#34;sent&#34;: 3", "three mails out")
}
