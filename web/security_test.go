package web_test

// The guard tried as an attacker would: DNS rebinding through the Host
// header, read-only credentials used to write, slow and idle clients,
// scheme spellings, cross-origin writes and words put into ?msg=. Each
// test runs a real server on a real SQLite store and checks what the
// store holds after.

import (
	"bufio"
	b64 "encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// execBody is the rebinding attack's payload: an exec task.
const execBody = `{"key":"x","kind":"exec","payload":{"argv":["/bin/sh","-c","id > /tmp/pwned"]}}`

// raw sends req, a whole HTTP/1.x request with CRLF line ends, on a new
// connection to e's server and returns the answer.
func (e *env) raw(req string) *http.Response {
	e.t.Helper()
	c, err := net.Dial("tcp", e.addr())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second)) // an event stream let through would never end
	if _, err := io.WriteString(c, req); err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		e.t.Fatalf("%q: %v", req, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func (e *env) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

// everything is every document in the store, tasks and leasepool's own.
func (e *env) everything() string {
	e.t.Helper()
	var all []*task.Task
	for _, reserved := range []bool{false, true} {
		l, err := e.store.List(e.t.Context(), task.ListQuery{Reserved: reserved})
		if err != nil {
			e.t.Fatal(err)
		}
		all = append(all, l...)
	}
	b, err := json.Marshal(all)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b) + e.snapshot()
}

// body reads resp's body.
func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHostCheckRefusesRebinding: the DNS-rebinding request (a page on
// rebind.evil.example, which resolves to 127.0.0.1, posting an exec task
// as same-origin) is refused 421 before anything runs, and the store is
// unchanged; so are the pages, the event stream and /metrics.
func TestHostCheckRefusesRebinding(t *testing.T) {
	t.Parallel()
	metricsHit := false
	e := newEnv(t, web.Config{Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { metricsHit = true })})
	before := e.everything()
	evil := "rebind.evil.example:" + e.srv.URL[strings.LastIndexByte(e.srv.URL, ':')+1:]
	resp := e.raw("POST /api/v1/tasks HTTP/1.1\r\nHost: " + evil + "\r\nOrigin: http://" + evil +
		"\r\nSec-Fetch-Site: same-origin\r\nContent-Type: application/json\r\nContent-Length: " +
		fmt.Sprint(len(execBody)) + "\r\n\r\n" + execBody)
	got := body(t, resp)
	if resp.StatusCode != http.StatusMisdirectedRequest || resp.Header.Get("Content-Type") != "application/json" ||
		!strings.Contains(got, `"error":"host \"`+evil+`\" is not served here; `) {
		t.Errorf("rebinding publish: %d %s %s; want 421 and the JSON error naming the host", resp.StatusCode, resp.Header.Get("Content-Type"), got)
	}
	if after := e.everything(); after != before {
		t.Errorf("the refused publish wrote to the store:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := e.store.Get(t.Context(), "x"); err == nil {
		t.Error("task x exists after the refused publish")
	}
	for _, path := range []string{"/", "/tasks", "/task?key=x", "/controls", "/api/v1/tasks", "/api/v1/events", "/metrics", "/static/app.js", "/nope"} {
		resp := e.raw("GET " + path + " HTTP/1.1\r\nHost: " + evil + "\r\n\r\n")
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("GET %s with Host %s: %d, want 421", path, evil, resp.StatusCode)
		}
	}
	if metricsHit {
		t.Error("/metrics ran for a refused host")
	}
}

// TestHostCheckHosts: with no credentials only loopback names are served,
// any port; names that merely look local, and malformed values, are not.
func TestHostCheckHosts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	for _, host := range []string{"localhost", "localhost:8080", "LOCALHOST:1", "127.0.0.1", "127.0.0.1:9", "127.1.2.3:80",
		"[::1]", "[::1]:8080", "[::ffff:127.0.0.1]:80"} {
		if resp := e.raw("GET /api/v1/stats HTTP/1.1\r\nHost: " + host + "\r\n\r\n"); resp.StatusCode != 200 {
			t.Errorf("Host %q: %d, want 200", host, resp.StatusCode)
		}
	}
	for _, host := range []string{"rebind.evil.example", "evil.example:80", "localhost.evil.example", "127.0.0.1.nip.io",
		"app.localhost", "localhost.", "0.0.0.0", "0.0.0.0:8080", "10.0.0.1", "[::]", "[fe80::1]:80", "[::1", "[::1]x",
		"127.0.0.1:80:80", "localhost:http", "localhost:1234567", "[127.0.0.1]", "127.1", "2130706433", "0x7f000001",
		"::1", "user@localhost", "localhost%00.evil.example"} {
		resp := e.raw("GET /api/v1/stats HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		// Go's server refuses some malformed Host values itself, with 400.
		if resp.StatusCode != http.StatusMisdirectedRequest && resp.StatusCode != http.StatusBadRequest {
			t.Errorf("Host %q: %d, want 421 (or Go's own 400)", host, resp.StatusCode)
		}
	}
	// HTTP/1.0 may omit Host: the request names no host, so it is refused.
	if resp := e.raw("GET /api/v1/stats HTTP/1.0\r\n\r\n"); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("no Host: %d, want 421", resp.StatusCode)
	}
}

// TestHostCheckAllowedHosts: AllowedHosts (serve's --public-url) adds a
// name, and keeps the check on even with credentials; credentials without
// AllowedHosts serve any Host.
func TestHostCheckAllowedHosts(t *testing.T) {
	t.Parallel()
	pub := newEnv(t, web.Config{Token: token, AllowedHosts: []string{"leasepool.example.com"}})
	open := newEnv(t, web.Config{Token: token})
	for _, c := range []struct {
		e    *env
		host string
		want int
	}{
		{pub, "leasepool.example.com", 200}, {pub, "LeasePool.Example.com:8443", 200}, {pub, "127.0.0.1", 200},
		{pub, "rebind.evil.example", 421}, {pub, "example.com", 421},
		{open, "rebind.evil.example", 200}, {open, "10.1.2.3:8080", 200},
	} {
		resp := c.e.raw("GET /api/v1/stats HTTP/1.1\r\nHost: " + c.host + "\r\nAuthorization: Bearer " + token + "\r\n\r\n")
		if resp.StatusCode != c.want {
			t.Errorf("Host %q (AllowedHosts %v): %d, want %d", c.host, c.e == pub, resp.StatusCode, c.want)
		}
	}
	// The Host check runs before the login: a refused host learns nothing
	// of the credentials either way.
	if resp := pub.raw("GET /api/v1/stats HTTP/1.1\r\nHost: evil.example\r\n\r\n"); resp.StatusCode != 421 {
		t.Errorf("refused host without a token: %d, want 421", resp.StatusCode)
	}
	// AllowAddressHosts adds every IP literal, never a name.
	addrs := newEnv(t, web.Config{AllowAddressHosts: true})
	for host, want := range map[string]int{"10.1.2.3:9464": 200, "[fe80::1]:80": 200, "192.168.1.1": 200,
		"rebind.evil.example": 421, "10.1.2.3.nip.io": 421, "127.1": 421} {
		if resp := addrs.raw("GET /api/v1/stats HTTP/1.1\r\nHost: " + host + "\r\n\r\n"); resp.StatusCode != want {
			t.Errorf("AllowAddressHosts, Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
	if _, err := web.NewHandler(web.Config{Store: pub.store, AllowedHosts: []string{"example.com:80"}}); err == nil ||
		!strings.Contains(err.Error(), "AllowedHosts") {
		t.Errorf("AllowedHosts with a port: err %v, want one naming AllowedHosts", err)
	}
}

// TestReadCredential: a read-only token or basic-auth login GETs
// everything (API, pages, event stream, /metrics) and every write, API or
// form, is refused 403 with the store unchanged; the pages show it no
// write controls. The full credentials still write.
func TestReadCredential(t *testing.T) {
	t.Parallel()
	const readToken = "read-only-token"
	e := newEnv(t, web.Config{Token: token, ReadToken: readToken, BasicUser: "ops", BasicPassword: "pw",
		ReadBasicUser: "viewer", ReadBasicPassword: "look",
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "leasepool_up 1\n") })})
	e.publish("a", "mail", `{}`)
	readBasic := "Basic " + b64.StdEncoding.EncodeToString([]byte("viewer:look"))
	for _, auth := range []string{"Bearer " + readToken, readBasic} {
		for _, path := range []string{"/api/v1/tasks", "/api/v1/tasks/a", "/api/v1/workers", "/api/v1/devices", "/api/v1/stats",
			"/api/v1/flows", "/api/v1/pauses", "/api/v1/limits", "/api/v1/schedules"} {
			if code, out := e.doAuth("GET", path, "", auth); code != 200 {
				t.Errorf("%s GET %s: %d %s, want 200", auth[:6], path, code, out)
			}
		}
		page := func(path string) (int, string) {
			return e.send("GET", path, nil, func(r *http.Request) { r.Header.Set("Authorization", auth) })
		}
		for _, path := range []string{"/", "/tasks", "/task?key=a", "/flows", "/workers", "/devices", "/controls", "/metrics"} {
			if code, _ := page(path); code != 200 {
				t.Errorf("%s GET %s: %d, want 200", auth[:6], path, code)
			}
		}
		for path, control := range map[string]string{"/task?key=a": `id="cancel"`, "/tasks": `id="bulk-cancel"`, "/controls": `action="/controls/pause"`} {
			if _, out := page(path); strings.Contains(out, control) || !strings.Contains(out, "read-only") {
				t.Errorf("%s GET %s shows the write control %s to a read-only login, or no read-only badge", auth[:6], path, control)
			}
		}
		// The event stream opens (its first message is the position).
		req, _ := http.NewRequestWithContext(t.Context(), "GET", e.srv.URL+"/api/v1/events", nil)
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("%s event stream: %v %v", auth[:6], err, resp)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
	before := e.everything()
	// A full login's page carries the CSRF token; the read-only one's has
	// no forms, and a token copied from elsewhere must not help it.
	_, out := e.send("GET", "/tasks", nil, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) })
	csrf := csrfField.FindStringSubmatch(out)
	if csrf == nil {
		t.Fatal("no csrf token on the full login's task list")
	}
	writes := []struct{ method, path, body string }{
		{"POST", "/api/v1/tasks", execBody}, {"POST", "/api/v1/tasks/bulk", `{"action":"cancel","keys":["a"]}`},
		{"POST", "/api/v1/tasks/batch", `{"tasks":[{"key":"rb","kind":"noop"}]}`},
		{"POST", "/api/v1/tasks/a/cancel", ""}, {"POST", "/api/v1/tasks/a/retry", ""},
		{"POST", "/api/v1/flows", `{}`}, {"POST", "/api/v1/flows/f/cancel", ""}, {"POST", "/api/v1/flows/f/retry", ""},
		{"POST", "/api/v1/pauses", `{"scope":"all"}`}, {"DELETE", "/api/v1/pauses?scope=all", ""},
		{"PUT", "/api/v1/limits", `{"scope":"kind","name":"mail","rate":"1/1s"}`}, {"DELETE", "/api/v1/limits?scope=kind&name=mail", ""},
		{"POST", "/api/v1/schedules/nightly/pause", ""}, {"POST", "/api/v1/schedules/nightly/resume", ""},
		{"POST", "/api/v1/devices/d1/approve", ""}, {"DELETE", "/api/v1/devices/d1", ""},
		{"PATCH", "/api/v1/tasks/a", "{}"}, {"OPTIONS", "/api/v1/tasks", ""}, {"POST", "/nope", ""},
	}
	for _, auth := range []string{"Bearer " + readToken, "bearer " + readToken, readBasic} {
		for _, w := range writes {
			if code, out := e.doAuth(w.method, w.path, w.body, auth); code != 403 || out != `{"error":"this credential is read-only"}`+"\n" {
				t.Errorf("%s %s %s: %d %s, want 403 this credential is read-only", auth[:6], w.method, w.path, code, out)
			}
		}
		for _, path := range []string{"/task/cancel", "/task/retry", "/tasks/bulk", "/controls/pause", "/controls/resume", "/controls/schedule", "/flow/cancel", "/flow/signal", "/device/approve"} {
			f := url.Values{"csrf": {csrf[1]}, "key": {"a"}, "action": {"cancel"}, "scope": {"all"}, "name": {"nightly"}, "op": {"pause"}, "device": {"d1"}}
			code, out := e.send("POST", path, f, func(r *http.Request) {
				r.Header.Set("Authorization", auth)
				r.Header.Set("Sec-Fetch-Site", "same-origin")
			})
			if code != 403 || !strings.Contains(out, "this credential is read-only") {
				t.Errorf("%s form POST %s: %d %s, want 403", auth[:6], path, code, out)
			}
		}
	}
	if after := e.everything(); after != before {
		t.Errorf("read-only writes changed the store:\nbefore %s\nafter  %s", before, after)
	}
	// The full credentials still write.
	if code, out := e.do("POST", "/api/v1/pauses", `{"scope":"all"}`); code != 201 {
		t.Errorf("full token pause: %d %s", code, out)
	}
	if code, _ := e.doAuth("POST", "/api/v1/tasks/a/cancel", "", "Basic "+b64.StdEncoding.EncodeToString([]byte("ops:pw"))); code != 200 {
		t.Errorf("full basic-auth cancel: %d, want 200", code)
	}
	// The read password with the full user is no login at all.
	if code, _ := e.doAuth("GET", "/api/v1/stats", "", "Basic "+b64.StdEncoding.EncodeToString([]byte("ops:look"))); code != 401 {
		t.Errorf("full user with the read password: %d, want 401", code)
	}
}

// TestBearerScheme: the scheme is case-insensitive (RFC 9110); the token
// is not, and it follows one space.
func TestBearerScheme(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	for auth, want := range map[string]int{
		"Bearer " + token: 200, "bearer " + token: 200, "BEARER " + token: 200, "bEaReR " + token: 200, "Bearer  " + token: 401,
		"Bearer " + strings.ToUpper(token): 401, "Bearer" + token: 401, "Bearer ": 401, "Token " + token: 401, token: 401,
	} {
		if code, _ := e.doAuth("GET", "/api/v1/stats", "", auth); code != want {
			t.Errorf("Authorization %q: %d, want %d", auth, code, want)
		}
	}
}

// TestCrossOriginJSON: the cross-origin refusal is the API's JSON error,
// not text.
func TestCrossOriginJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	before := e.everything()
	resp := e.raw("POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\nSec-Fetch-Site: cross-site\r\n" +
		"Content-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(execBody)) + "\r\n\r\n" + execBody)
	got := body(t, resp)
	var eb struct{ Error string }
	if resp.StatusCode != 403 || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(got), &eb) != nil ||
		!strings.Contains(eb.Error, "cross-origin") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("cross-origin publish: %d %v %s; want 403 and a JSON error", resp.StatusCode, resp.Header, got)
	}
	if after := e.everything(); after != before {
		t.Error("the cross-origin publish wrote to the store")
	}
}

// TestFlashCodes: ?msg= shows only the dashboard's own messages; any
// other text, HTML or not, shows nothing.
func TestFlashCodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.wantPage("/controls?msg=paused", 200, `id="flash">paused<`)
	e.wantPage("/tasks?msg=retried-2-0-1", 200, `id="flash">retried 2, skipped 0, failed 1 (see the server log)<`)
	for _, msg := range []string{"Your session expired: log in at https://evil.example", "<b>hi</b>", "paused ", "retried-2-0-x",
		"deleted-1-1", "cancelled-1234567890-1", "toString", "__proto__"} {
		if out := e.wantPage("/tasks?msg="+url.QueryEscape(msg), 200); strings.Contains(out, `id="flash"`) {
			t.Errorf("?msg=%q shows a message", msg)
		}
	}
}

// limitsServer serves e's handler, configured with cfg, through
// web.NewServer with lim; it returns the address.
func limitsServer(t *testing.T, cfg web.Config, lim web.ServerLimits) (*env, string) {
	t.Helper()
	cfg.Limits = lim
	e := newEnv(t, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := e.srv.Config.Handler
	srv := web.NewServer(h, lim)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return e, l.Addr().String()
}

// closedWithin reports whether the server closes c within d, reading and
// dropping what it sends. A close with bytes of ours still unread arrives
// as a reset rather than EOF: closed too.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout()) // only the deadline means still open
}

// TestServerLimitsSlowClients: with short limits, a client that could
// not log in is cut off after its 401 however it sends its body, an idle
// keep-alive connection is closed, a dripped body or header is cut off,
// and oversized headers get 431.
func TestServerLimitsSlowClients(t *testing.T) {
	t.Parallel()
	lim := web.ServerLimits{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 600 * time.Millisecond,
		WriteTimeout: 600 * time.Millisecond, IdleTimeout: 400 * time.Millisecond, MaxHeaderBytes: 4 << 10}
	e, addr := limitsServer(t, web.Config{Token: token}, lim)
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	read := func(br *bufio.Reader) *http.Response {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp
	}

	// Unauthenticated, body dripped: the 401 comes at once and the
	// connection is closed, long before the body would end.
	c, br := dial()
	io.WriteString(c, "POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{")
	go func(c net.Conn) {
		for range 50 {
			time.Sleep(50 * time.Millisecond) // a slow client: the drip is the point
			if _, err := io.WriteString(c, " "); err != nil {
				return
			}
		}
	}(c)
	if resp := read(br); resp.StatusCode != 401 || !resp.Close {
		t.Errorf("unauthenticated dripped body: %d close=%v, want 401 and Connection: close", resp.StatusCode, resp.Close)
	}
	if !closedWithin(c, 2*time.Second) {
		t.Error("unauthenticated dripped body: the connection stayed open after the 401")
	}

	// Unauthenticated keep-alive: closed after the 401, not kept idle.
	c, br = dial()
	io.WriteString(c, "GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp := read(br); resp.StatusCode != 401 {
		t.Errorf("unauthenticated GET: %d, want 401", resp.StatusCode)
	}
	start := time.Now()
	if !closedWithin(c, 2*time.Second) || time.Since(start) > lim.IdleTimeout {
		t.Errorf("unauthenticated keep-alive: not closed at once after the 401 (%s)", time.Since(start))
	}

	// Authenticated keep-alive: closed once idle for IdleTimeout.
	c, br = dial()
	io.WriteString(c, "GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+token+"\r\n\r\n")
	if resp := read(br); resp.StatusCode != 200 || resp.Close {
		t.Errorf("authenticated GET: %d close=%v, want 200 kept alive", resp.StatusCode, resp.Close)
	}
	if !closedWithin(c, 3*time.Second) {
		t.Error("idle keep-alive connection still open after IdleTimeout")
	}

	// Authenticated, body dripped: cut off at ReadTimeout, nothing
	// published.
	before := e.everything()
	c, _ = dial()
	io.WriteString(c, "POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+token+
		"\r\nContent-Length: "+fmt.Sprint(len(execBody))+"\r\n\r\n")
	start = time.Now()
	go func(c net.Conn) {
		for i := range len(execBody) - 1 { // never the last byte
			if _, err := io.WriteString(c, execBody[i:i+1]); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // a slow client: the whole body would take 8 s
		}
	}(c)
	if !closedWithin(c, 6*time.Second) {
		t.Error("a dripped body held its connection past ReadTimeout")
	} else if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a dripped body was cut off after %s, want about ReadTimeout (%s)", took, lim.ReadTimeout)
	}
	if e.everything() != before {
		t.Error("the cut-off body published")
	}

	// Headers dripped: cut off at ReadHeaderTimeout.
	c, _ = dial()
	go func(c net.Conn) {
		for _, b := range []byte("GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond) // a slow client: the drip is the point
		}
	}(c)
	if !closedWithin(c, 3*time.Second) {
		t.Error("dripped headers held the connection past ReadHeaderTimeout")
	}

	// Headers over MaxHeaderBytes: 431.
	c, br = dial()
	io.WriteString(c, "GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "+strings.Repeat("a", 16<<10)+"\r\n\r\n")
	if resp := read(br); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB of headers: %d, want 431", resp.StatusCode)
	}
}

// TestServerLimitsEventStream: an event stream outlives ReadTimeout and
// WriteTimeout several times over, idle (no heartbeat in the while), and
// still delivers.
func TestServerLimitsEventStream(t *testing.T) {
	t.Parallel()
	lim := web.ServerLimits{ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond}
	e, addr := limitsServer(t, web.Config{}, lim)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("event stream: %v %v", err, resp)
	}
	time.Sleep(4 * lim.WriteTimeout) // idle past the timeouts: the time is the point
	e.pub("late", "mail")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") && strings.Contains(sc.Text(), `"late"`) {
			return
		}
	}
	t.Fatalf("the stream ended before the event published after %s: %v", 4*lim.WriteTimeout, sc.Err())
}

// TestRefusedWhole: a body over the limit answers 413, a cancel or retry
// of one of leasepool's own documents 400 naming the key; neither writes.
func TestRefusedWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	before := e.everything()
	big := `{"key":"big","kind":"noop","payload":"` + strings.Repeat("x", 2<<20) + `"}`
	e.want("POST", "/api/v1/tasks", big, http.StatusRequestEntityTooLarge, `{"error":"body: larger than `)
	e.want("POST", "/api/v1/flows", `{"key":"f","steps":[{"name":"a","kind":"noop","payload":"`+strings.Repeat("x", 2<<20)+`"}]}`,
		http.StatusRequestEntityTooLarge, "body: larger than")
	e.want("POST", "/api/v1/pauses", `{"scope":"kind","name":"`+strings.Repeat("x", 128<<10)+`"}`, http.StatusRequestEntityTooLarge, "body: larger than")
	for _, verb := range []string{"cancel", "retry"} {
		e.want("POST", "/api/v1/tasks/leasepool:control/"+verb, "", http.StatusBadRequest,
			`key: \"leasepool:control\" is reserved`)
	}
	if after := e.everything(); after != before {
		t.Errorf("refused requests wrote:\nbefore %s\nafter  %s", before, after)
	}
}
