package tests

// The HTTP surface tried as an attacker would: real `leasepool serve` and
// worker processes over one SQLite store on disk, hostile requests built
// from lists, and the store compared table by table before and after.
// docs/security.md documents each answer asserted here.

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// startServe runs `leasepool serve` on a free loopback port and waits
// until it answers; it returns the address.
func startServe(t *testing.T, storeURL string, env []string, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(leasepoolBin(t), append([]string{"--store", storeURL, "--log-level", "warn", "serve", "--listen", addr}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("serve log:\n%s", tail(string(b), 4000))
		}
	})
	eventually(t, 30*time.Second, "serve to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// snapshotStore reads every table of the SQLite store at path into one
// string, rows in a fixed order. The clock table (any process opening the
// store may raise its high-water mark) and the worker registry (live
// workers renew their entries) are left out.
func snapshotStore(t *testing.T, path string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('clock', 'workers') ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	var b strings.Builder
	for _, table := range tables {
		fmt.Fprintf(&b, "== %s\n", table)
		rows, err := db.Query(`SELECT * FROM "` + table + `"`)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		var lines []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, fmt.Sprintf("%q", vals))
		}
		rows.Close()
		slices.Sort(lines)
		b.WriteString(strings.Join(lines, "\n"))
		b.WriteString("\n")
	}
	return b.String()
}

// hostile is one request an attacker sends and the status it must get.
type hostile struct {
	name         string
	method, path string
	host         string // "" keeps the address dialled
	headers      map[string]string
	body         string
	want         int
}

func (h hostile) do(t *testing.T, addr string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(h.method, "http://"+addr+h.path, strings.NewReader(h.body))
	if err != nil {
		t.Fatalf("%s: %v", h.name, err)
	}
	if h.host != "" {
		req.Host = h.host
	}
	for k, v := range h.headers {
		req.Header.Set(k, v)
	}
	if h.body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", h.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, string(b)
}

// execBody is the payload a rebinding page would post: a shell command.
func execBody(key, marker string) string {
	return fmt.Sprintf(`{"key":%q,"kind":"exec","payload":{"argv":["/bin/sh","-c","id > %s"]}}`, key, marker)
}

func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
}

// TestAttackSurface sends every hostile request to a `leasepool serve`
// with no credentials on loopback (the default) and asserts each answer and
// that the store is unchanged; then a default worker is given an exec task
// and must not run it.
func TestAttackSurface(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "store.db")
	storeURL := "sqlite:" + dbPath
	marker := filepath.Join(dir, "pwned")
	// One real task first, so "unchanged" compares a store with content.
	if _, stderr, code := runCLI(t, "--store", storeURL, "publish", "seed", "--kind", "noop"); code != 0 {
		t.Fatalf("publish seed: exit %d: %s", code, stderr)
	}
	addr := startServe(t, storeURL, nil)
	_, port, _ := net.SplitHostPort(addr)

	var cases []hostile
	// DNS rebinding: a page whose name now resolves to 127.0.0.1. Every
	// route, read or write, is refused on its Host before anything else.
	rebindHosts := []string{
		"rebind.evil.example:" + port, "rebind.evil.example", "evil.example:80",
		"127.0.0.1.nip.io:" + port, "localhost.evil.example:" + port, "localhost." + "evil:" + port,
		"xn--80ak6aa92e.example:" + port, "LOCALHOST.evil.example", "0.0.0.0:" + port, "10.0.0.1:" + port,
		"[fe80::1]:" + port, "192.168.1.1", "example.com",
	}
	routes := []struct{ method, path, body string }{
		{"GET", "/", ""},
		{"GET", "/tasks", ""},
		{"GET", "/api/v1/tasks", ""},
		{"GET", "/api/v1/stats", ""},
		{"GET", "/api/v1/workers", ""},
		{"GET", "/metrics", ""},
		{"POST", "/api/v1/tasks", execBody("rebind", marker)},
		{"POST", "/api/v1/tasks/bulk", `{"action":"cancel","filter":{}}`},
		{"POST", "/api/v1/tasks/seed/cancel", ""},
		{"POST", "/api/v1/pauses", `{"kind":"noop"}`},
		{"PUT", "/api/v1/limits", `{"bucket":"x","rate":1,"per":"1s"}`},
		{"POST", "/api/v1/flows", `{"key":"f","steps":[{"name":"a","kind":"exec","payload":{"argv":["/bin/true"]}}]}`},
	}
	for _, host := range rebindHosts {
		for _, r := range routes {
			cases = append(cases, hostile{
				name: "rebind " + host + " " + r.method + " " + r.path, method: r.method, path: r.path, host: host, body: r.body,
				headers: map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"},
				want:    http.StatusMisdirectedRequest,
			})
		}
	}
	// Cross-origin writes from a page on another site, with the right Host.
	for _, origin := range []string{"http://evil.example", "null", "http://127.0.0.1.evil.example:" + port, "https://localhost:" + port} {
		for _, r := range routes {
			if r.method == "GET" {
				continue
			}
			cases = append(cases, hostile{
				name: "cross-origin " + origin + " " + r.method + " " + r.path, method: r.method, path: r.path, body: r.body,
				headers: map[string]string{"Origin": origin, "Sec-Fetch-Site": "cross-site"},
				want:    http.StatusForbidden,
			})
		}
	}
	// Bodies that must be refused whole, naming their field.
	bad := []struct{ name, body string }{
		{"reserved control key", `{"key":"leasepool:control","kind":"noop","rerun":true}`},
		{"reserved flow key", `{"key":"leasepool:flow:x","kind":"leasepool.flow","payload":{"bad":true}}`},
		{"reserved prefix only", `{"key":"leasepool:","kind":"noop"}`},
		{"payload nested 1001 deep", `{"key":"deep","kind":"noop","payload":` + nested(1001) + `}`},
		{"payload nested 65 deep", `{"key":"deep65","kind":"noop","payload":` + nested(65) + `}`},
		{"run_at in 9999", `{"key":"far","kind":"noop","run_at":"9999-01-01T00:00:00Z"}`},
		{"run_at in 1000", `{"key":"past","kind":"noop","run_at":"1000-01-01T00:00:00Z"}`},
		{"invalid UTF-8 key", "{\"key\":\"bad\xff\xfekey\",\"kind\":\"noop\"}"},
		{"invalid UTF-8 kind", "{\"key\":\"badkind\",\"kind\":\"no\xffop\"}"},
		{"empty key", `{"key":"","kind":"noop"}`},
		{"key with NUL", `{"key":"a\u0000b","kind":"noop"}`},
		{"not JSON", `key=x&kind=exec`},
		{"trailing garbage", `{"key":"t","kind":"noop"} {"key":"u"}`},
		{"unknown field", `{"key":"u","kind":"noop","admin":true}`},
		{"negative priority overflow", `{"key":"p","kind":"noop","priority":1e309}`},
		{"exec payload not an object", `{"key":"e","kind":"exec","payload":"rm -rf /"}`},
	}
	for _, b := range bad {
		cases = append(cases, hostile{name: b.name, method: "POST", path: "/api/v1/tasks", body: b.body, want: http.StatusBadRequest})
	}
	cases = append(cases,
		hostile{name: "bulk reserved", method: "POST", path: "/api/v1/tasks/bulk",
			body: `{"action":"retry","keys":["leasepool:control"]}`, want: http.StatusBadRequest},
		hostile{name: "flow reserved step payload deep", method: "POST", path: "/api/v1/flows",
			body: `{"key":"fd","steps":[{"name":"a","kind":"noop","payload":` + nested(1001) + `}]}`, want: http.StatusBadRequest},
		hostile{name: "body over the limit", method: "POST", path: "/api/v1/tasks",
			body: `{"key":"big","kind":"noop","payload":"` + strings.Repeat("x", 2<<20) + `"}`, want: http.StatusRequestEntityTooLarge},
		hostile{name: "cancel reserved", method: "POST", path: "/api/v1/tasks/leasepool:control/cancel", want: http.StatusBadRequest},
		hostile{name: "method not allowed", method: "DELETE", path: "/api/v1/tasks", want: http.StatusMethodNotAllowed},
		hostile{name: "trace", method: "TRACE", path: "/api/v1/tasks", want: http.StatusMethodNotAllowed},
		hostile{name: "unknown api path", method: "POST", path: "/api/v1/admin", body: `{}`, want: http.StatusNotFound},
	)
	if len(cases) < 100 {
		t.Fatalf("only %d hostile requests: the list should hold at least 100", len(cases))
	}

	// No worker runs while the requests are sent: workers write (leases,
	// schedules) and nothing else may.
	before := snapshotStore(t, dbPath)
	for _, h := range cases {
		code, hdr, body := h.do(t, addr)
		if code != h.want {
			t.Errorf("%s: status %d, want %d (body %s)", h.name, code, h.want, tail(body, 300))
			continue
		}
		if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s: Content-Type %q, want a JSON error", h.name, ct)
		} else {
			var e struct{ Error string }
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" || strings.Contains(e.Error, "\n") {
				t.Errorf("%s: want one-line JSON error, got %q", h.name, tail(body, 300))
			}
		}
		if hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no X-Content-Type-Options: nosniff", h.name)
		}
		if strings.Contains(body, "root:") || strings.Contains(body, "uid=") {
			t.Errorf("%s: answer leaks %q", h.name, tail(body, 200))
		}
	}
	// HTTP/1.0 with no Host header at all.
	if got := rawStatus(t, addr, "GET /api/v1/tasks HTTP/1.0\r\n\r\n"); got != http.StatusMisdirectedRequest {
		t.Errorf("HTTP/1.0 without Host: status %d, want 421", got)
	}
	if after := snapshotStore(t, dbPath); after != before {
		t.Errorf("hostile requests changed the store:\nbefore:\n%s\nafter:\n%s", tail(before, 3000), tail(after, 3000))
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("an exec program ran: the marker file exists")
	}

	// The same server answers its own pages and API on loopback names.
	for _, host := range []string{addr, "localhost:" + port, "[::1]:" + port, "127.0.0.1"} {
		for _, path := range []string{"/", "/api/v1/tasks", "/metrics"} {
			code, hdr, _ := hostile{method: "GET", path: path, host: host}.do(t, addr)
			if code != http.StatusOK {
				t.Errorf("GET %s with Host %s: status %d, want 200", path, host, code)
			}
			if strings.HasPrefix(path, "/api/") && hdr.Get("Cache-Control") != "no-store" {
				t.Errorf("GET %s: Cache-Control %q, want no-store", path, hdr.Get("Cache-Control"))
			}
		}
	}
	// ?msg= carries no text of the attacker's onto a page.
	_, _, page := hostile{method: "GET", path: "/?msg=Your+session+expired%2C+call+555-0100"}.do(t, addr)
	if strings.Contains(page, "555-0100") {
		t.Error("the dashboard shows ?msg= text")
	}
	// A trusted publish of exec through the CLI is written, but a worker
	// started as a victim would start it (no --kinds) does not run it.
	startWorker(t, storeURL, "victim")
	if _, stderr, code := runCLI(t, "--store", storeURL, "publish", "trusted-exec", "--kind", "exec",
		"--payload", fmt.Sprintf(`{"argv":["/bin/sh","-c","id > %s"]}`, marker)); code != 0 {
		t.Fatalf("publish trusted-exec: exit %d: %s", code, stderr)
	}
	// A noop published after it has run: the worker is up and has passed
	// the exec task by.
	if _, stderr, code := runCLI(t, "--store", storeURL, "publish", "after", "--kind", "noop"); code != 0 {
		t.Fatalf("publish after: exit %d: %s", code, stderr)
	}
	eventually(t, 60*time.Second, "the victim to run a noop task", func() bool {
		out, _, _ := runCLI(t, "--store", storeURL, "show", "after")
		return strings.Contains(out, "succeeded")
	})
	if out, _, _ := runCLI(t, "--store", storeURL, "show", "trusted-exec"); !strings.Contains(out, "pending") {
		t.Errorf("the exec task is not pending:\n%s", out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a worker started without --kinds ran an exec task")
	}
}

// rawStatus writes req on a new connection and returns the answer's status.
func rawStatus(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAttackCredentials runs serve with a full and a read-only token: the
// read-only one reads everything and writes nothing; the lack of either is
// 401 with the connection closed.
func TestAttackCredentials(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "store.db")
	storeURL := "sqlite:" + dbPath
	const full, read = "full-token-4c1d9a", "read-token-77e0b2"
	addr := startServe(t, storeURL, []string{"LEASEPOOL_TOKEN=" + full, "LEASEPOOL_READ_TOKEN=" + read})
	auth := func(v string) map[string]string { return map[string]string{"Authorization": v} }
	before := snapshotStore(t, dbPath)
	var cases []hostile
	for _, cred := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Bearer " + full + "x", "Basic " + full, "Bearer  " + full, "Token " + full} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/", ""}, {"GET", "/api/v1/tasks", ""}, {"GET", "/metrics", ""}, {"GET", "/api/v1/events", ""},
			{"POST", "/api/v1/tasks", `{"key":"x","kind":"noop"}`},
		} {
			cases = append(cases, hostile{name: fmt.Sprintf("cred %q %s %s", cred, r.method, r.path), method: r.method, path: r.path,
				body: r.body, headers: auth(cred), want: http.StatusUnauthorized})
		}
	}
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/api/v1/tasks", `{"key":"x","kind":"noop"}`},
		{"POST", "/api/v1/tasks/bulk", `{"action":"cancel","filter":{}}`},
		{"POST", "/api/v1/pauses", `{"kind":"noop"}`},
		{"PUT", "/api/v1/limits", `{"bucket":"x","rate":1,"per":"1s"}`},
		{"POST", "/api/v1/flows", `{"key":"f","steps":[{"name":"a","kind":"noop"}]}`},
	} {
		cases = append(cases, hostile{name: "read token " + r.method + " " + r.path, method: r.method, path: r.path,
			body: r.body, headers: auth("Bearer " + read), want: http.StatusForbidden})
	}
	for _, h := range cases {
		if code, _, body := h.do(t, addr); code != h.want {
			t.Errorf("%s: status %d, want %d (%s)", h.name, code, h.want, tail(body, 200))
		}
	}
	if after := snapshotStore(t, dbPath); after != before {
		t.Errorf("refused requests changed the store:\nbefore:\n%s\nafter:\n%s", tail(before, 3000), tail(after, 3000))
	}
	// The read token reads everything.
	for _, path := range []string{"/", "/tasks", "/api/v1/tasks", "/api/v1/stats", "/metrics"} {
		if code, _, body := (hostile{method: "GET", path: path, headers: auth("Bearer " + read)}).do(t, addr); code != http.StatusOK {
			t.Errorf("read token GET %s: status %d (%s)", path, code, tail(body, 200))
		}
	}
	// The full token writes, with the scheme in any case.
	for i, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		body := fmt.Sprintf(`{"key":"ok-%d","kind":"noop"}`, i)
		if code, _, resp := (hostile{method: "POST", path: "/api/v1/tasks", body: body, headers: auth(scheme + " " + full)}).do(t, addr); code != http.StatusCreated {
			t.Errorf("%s full token publish: status %d (%s)", scheme, code, tail(resp, 200))
		}
	}
	// An unauthenticated client cannot keep its connection after the 401.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	io.WriteString(c, "GET /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unauthenticated GET: status %d", resp.StatusCode)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("connection after a 401: read gave %v, want EOF (closed by the server)", err)
	}
}

// TestAttackSecretsNotLeaked runs a worker with leasepool's secrets and a
// cloud key in its environment: an exec program's environment holds none
// of them and no log line shows them. A worker and a device simulator
// given an MQTT URL with a password never print it.
func TestAttackSecretsNotLeaked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	storeURL := "sqlite:" + filepath.Join(dir, "store.db")
	envOut := filepath.Join(dir, "env.txt")
	secrets := map[string]string{
		"LEASEPOOL_TOKEN":         "tok-3b9f0e",
		"LEASEPOOL_READ_TOKEN":    "rtok-91aa2c",
		"LEASEPOOL_BASIC_AUTH":    "admin:basic-5d2e7a",
		"LEASEPOOL_METRICS_TOKEN": "mtok-0c4f11",
		"LEASEPOOL_MQTT_PASSWORD": "mqttpw-6e8b3d",
		"AWS_SECRET_ACCESS_KEY":   "aws-secret-2f7c9e",
	}
	var env []string
	for k, v := range secrets {
		env = append(env, k+"="+v)
	}
	logs := runFor(t, 0, env, "--store", storeURL, "--log-level", "debug", "worker", "--id", "w1", "--kinds", "exec,noop")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", tail(logs(), 3000))
		}
	})
	if _, stderr, code := runCLI(t, "--store", storeURL, "publish", "env", "--kind", "exec",
		"--payload", fmt.Sprintf(`{"argv":["/bin/sh","-c","env > %s"]}`, envOut)); code != 0 {
		t.Fatalf("publish: exit %d: %s", code, stderr)
	}
	eventually(t, 60*time.Second, "the exec task to write its environment", func() bool {
		b, err := os.ReadFile(envOut)
		return err == nil && strings.Contains(string(b), "PATH=")
	})
	got, _ := os.ReadFile(envOut)
	for k, v := range secrets {
		if strings.Contains(string(got), v) {
			t.Errorf("the exec program's environment holds %s", k)
		}
	}
	// Passwords in MQTT URLs, with the characters that break naive
	// masking, against a broker that is not there; the four processes
	// run at once.
	var outs []func() string
	for i, pw := range []string{"urlpw-8d1e4b", "urlpw-8d1e4b%3Fx%40y%2F"} {
		url := "tcp://user:" + pw + "@127.0.0.1:1"
		outs = append(outs,
			runFor(t, 5*time.Second, nil, "--store", storeURL, "--log-level", "debug", "worker", "--id", fmt.Sprintf("w-mqtt-%d", i), "--kinds", "device", "--mqtt", url),
			runFor(t, 5*time.Second, nil, "device", "simulate", "--mqtt", url, "--duration", "2s"))
	}
	for _, out := range outs {
		if o := out(); strings.Contains(o, "urlpw-8d1e4b") {
			t.Errorf("an MQTT password is printed:\n%s", tail(o, 2000))
		}
	}
	for _, line := range strings.Split(logs(), "\n") {
		for k, v := range secrets {
			if strings.Contains(line, v) {
				t.Errorf("the worker logs %s: %s", k, line)
			}
		}
	}
}

// runFor starts leasepool with args and extra environment and returns a
// function giving its output. With d > 0 that function waits until the
// process exits or d has passed since its start (then kills it), so that
// processes started together wait out their time together; with d == 0 the
// process runs until the test ends and the function reads its output so
// far.
func runFor(t *testing.T, d time.Duration, env []string, args ...string) func() string {
	t.Helper()
	cmd := exec.Command(leasepoolBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	path := filepath.Join(t.TempDir(), "out.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(d)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			cmd.Process.Kill()
			<-done
			f.Close()
		})
	}
	t.Cleanup(stop)
	read := func() string { b, _ := os.ReadFile(path); return string(b) }
	if d == 0 {
		return read
	}
	var out string
	var outOnce sync.Once
	return func() string {
		outOnce.Do(func() {
			select {
			case <-done:
			case <-time.After(time.Until(deadline)):
			}
			stop()
			out = read()
		})
		return out
	}
}
