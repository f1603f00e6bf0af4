package main

import (
	"github.com/leasepool/leasepool/internal/testutil"

	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// freePort is a loopback HOST:PORT nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// running runs the CLI with args until the test's checks are done; it
// returns once addr accepts connections, and the stderr once stopped.
func running(t *testing.T, addr string, args ...string) (stop func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan string, 1)
	go func() {
		_, stderr := runExit(ctx, args...)
		done <- stderr
	}()
	if !testutil.Within(20*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		cancel()
		t.Fatalf("%v: nothing listens on %s:\n%s", args, addr, <-done)
	}
	return func() string { cancel(); return <-done }
}

// request sends method url with host as the Host header and auth as the
// Authorization header (none when empty); it returns the status.
func request(t *testing.T, method, url, host, auth, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestServeGuard: `serve` with a full and a read-only token and
// --public-url refuses another Host (421) on the API, the pages and
// /metrics, lets the read token GET everything and refuses its writes
// (403), and warns about secrets given as flags, naming their variables.
// (Not parallel: it sets LEASEPOOL_TOKEN.)
func TestServeGuard(t *testing.T) {
	c := setup(t)
	t.Setenv("LEASEPOOL_TOKEN", "full-s3cret")
	t.Setenv("LEASEPOOL_READ_TOKEN", "")
	t.Setenv("LEASEPOOL_PUBLIC_URL", "")
	addr := freePort(t)
	stop := running(t, addr, "--store", c.store, "serve", "--listen", addr, "--read-token", "r3ad-s3cret",
		"--public-url", "https://leasepool.example.com:8443/")
	base := "http://" + addr
	for _, r := range []struct {
		method, path, host, auth, body string
		want                           int
	}{
		{"POST", "/api/v1/tasks", "rebind.evil.example:" + addr[strings.LastIndexByte(addr, ':')+1:], "Bearer full-s3cret", `{"key":"x","kind":"noop"}`, 421},
		{"GET", "/", "rebind.evil.example", "Bearer full-s3cret", "", 421},
		{"GET", "/metrics", "rebind.evil.example", "Bearer r3ad-s3cret", "", 421},
		{"GET", "/api/v1/stats", "leasepool.example.com", "", "", 401},
		{"GET", "/api/v1/stats", "leasepool.example.com", "Bearer r3ad-s3cret", "", 200},
		{"GET", "/metrics", "leasepool.example.com:8443", "bearer r3ad-s3cret", "", 200},
		{"GET", "/tasks", "127.0.0.1", "Bearer r3ad-s3cret", "", 200},
		{"POST", "/api/v1/pauses", "127.0.0.1", "Bearer r3ad-s3cret", `{"scope":"all"}`, 403},
		{"POST", "/api/v1/pauses", addr, "Bearer full-s3cret", `{"scope":"all"}`, 201},
	} {
		if got := request(t, r.method, base+r.path, r.host, r.auth, r.body); got != r.want {
			t.Errorf("%s %s Host %q %q: %d, want %d", r.method, r.path, r.host, r.auth, got, r.want)
		}
	}
	stderr := stop()
	if !strings.Contains(stderr, "--read-token holds a secret") || !strings.Contains(stderr, "LEASEPOOL_READ_TOKEN") {
		t.Errorf("--read-token given as a flag: no warning naming LEASEPOOL_READ_TOKEN in\n%s", stderr)
	}
	if strings.Contains(stderr, "--token holds a secret") {
		t.Errorf("a token from LEASEPOOL_TOKEN was warned about as a flag:\n%s", stderr)
	}
	if strings.Contains(stderr, "r3ad-s3cret") || strings.Contains(stderr, "full-s3cret") {
		t.Errorf("a token was logged:\n%s", stderr)
	}
}

// TestServeGuardFlags: a malformed --public-url or --read-basic-auth, or
// a read credential equal to the full one, is refused with exit 2 naming
// the flag, before the store is opened. (Not parallel: it clears
// LEASEPOOL_TOKEN.)
func TestServeGuardFlags(t *testing.T) {
	c := setup(t)
	t.Setenv("LEASEPOOL_TOKEN", "")
	t.Setenv("LEASEPOOL_PUBLIC_URL", "")
	for _, tt := range []struct {
		args []string
		flag string
	}{
		{[]string{"--public-url", "leasepool.example.com"}, "--public-url"},
		{[]string{"--public-url", "ftp://leasepool.example.com"}, "--public-url"},
		{[]string{"--public-url", "https://user:pw@leasepool.example.com"}, "--public-url"},
		{[]string{"--public-url", "https://"}, "--public-url"},
		{[]string{"--read-basic-auth", "viewer"}, "--read-basic-auth"},
		{[]string{"--token", "same", "--read-token", "same"}, "--read-token"},
		{[]string{"--basic-auth", "ops:pw", "--read-basic-auth", "ops:pw"}, "--read-basic-auth"},
	} {
		code, stderr := runExit(t.Context(), append([]string{"--store", c.store, "serve", "--listen", "127.0.0.1:0"}, tt.args...)...)
		if code != exitBadInput || !strings.Contains(stderr, tt.flag) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("serve %v: exit %d, stderr %q; want 2 and one line naming %s", tt.args, code, stderr, tt.flag)
		}
	}
	// A read credential alone also lets serve listen off loopback.
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	t.Setenv("LEASEPOOL_READ_TOKEN", "read-token")
	if code, stderr := runExit(ctx, "--store", c.store, "serve", "--listen", "0.0.0.0:0"); code != exitOK {
		t.Errorf("serve --listen 0.0.0.0:0 with LEASEPOOL_READ_TOKEN: exit %d, stderr %q", code, stderr)
	}
}

// TestWorkerMetricsGuard: a worker's --metrics-addr server checks the
// Host (421 for a rebinding name), closes unauthenticated connections
// with a JSON 401 when --metrics-token is set, accepts the token in any
// case of "Bearer", and warns that the flag shows in ps. (Not parallel:
// it sets LEASEPOOL_METRICS_TOKEN.)
func TestWorkerMetricsGuard(t *testing.T) {
	c := setup(t)
	t.Setenv("LEASEPOOL_METRICS_TOKEN", "")
	addr := freePort(t)
	stop := running(t, addr, "--store", c.store, "worker", "--kinds", "noop", "--metrics-addr", addr)
	url := "http://" + addr + "/metrics"
	for host, want := range map[string]int{"rebind.evil.example": 421, "localhost": 200, addr: 200, "10.0.0.1": 421} {
		if got := request(t, "GET", url, host, "", ""); got != want {
			t.Errorf("worker metrics, no token, Host %q: %d, want %d", host, got, want)
		}
	}
	stop()

	// Listening on every interface, any address is served, no name.
	addr = freePort(t)
	_, port, _ := net.SplitHostPort(addr)
	stop = running(t, addr, "--store", c.store, "worker", "--kinds", "noop", "--metrics-addr", "0.0.0.0:"+port)
	url = "http://" + addr + "/metrics"
	for host, want := range map[string]int{"rebind.evil.example:" + port: 421, "10.0.0.1:" + port: 200, "[fe80::1]": 200, "localhost": 200} {
		if got := request(t, "GET", url, host, "", ""); got != want {
			t.Errorf("worker metrics on 0.0.0.0, no token, Host %q: %d, want %d", host, got, want)
		}
	}
	stop()

	addr = freePort(t)
	stop = running(t, addr, "--store", c.store, "worker", "--kinds", "noop", "--metrics-addr", addr, "--metrics-token", "m-token")
	url = "http://" + addr + "/metrics"
	for auth, want := range map[string]int{"": 401, "Bearer nope": 401, "Bearer m-token": 200, "BEARER m-token": 200} {
		if got := request(t, "GET", url, "scraper.example", auth, ""); got != want {
			t.Errorf("worker metrics with a token, Authorization %q: %d, want %d", auth, got, want)
		}
	}
	// The 401 ends the connection.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || !strings.Contains(string(b), "401 Unauthorized") || !strings.Contains(string(b), "Connection: close") ||
		!strings.Contains(string(b), `{"error":`) {
		t.Errorf("unauthenticated scrape: %v, answer %q; want a JSON 401 and the connection closed", err, b)
	}
	if stderr := stop(); !strings.Contains(stderr, "--metrics-token holds a secret") || !strings.Contains(stderr, "LEASEPOOL_METRICS_TOKEN") {
		t.Errorf("--metrics-token given as a flag: no warning naming LEASEPOOL_METRICS_TOKEN in\n%s", stderr)
	}
}
