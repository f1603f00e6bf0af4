package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
)

// runExit runs the CLI as main does and returns its exit status and stderr.
func runExit(ctx context.Context, args ...string) (int, string) {
	var stdout, stderr testutil.SyncBuffer
	runMu.Lock()
	defer runMu.Unlock()
	code := run(ctx, append([]string{"leasepool"}, args...), strings.NewReader(""), &stdout, &stderr)
	return code, stderr.String()
}

// TestServeRefusesOpenAddressWithoutToken: serving on an address others can
// reach needs a token; the refusal is one line naming --listen and --token,
// exit 2, and opens no store. (Not parallel: it clears LEASEPOOL_TOKEN.)
func TestServeRefusesOpenAddressWithoutToken(t *testing.T) {
	c := setup(t)
	t.Setenv("LEASEPOOL_TOKEN", "")
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "[::]:8080", "example.com:80", "192.168.1.5:8080"} {
		code, stderr := runExit(t.Context(), "--store", c.store, "serve", "--listen", addr)
		if code != exitBadInput || strings.Count(stderr, "\n") != 1 ||
			!strings.Contains(stderr, "--listen "+addr) || !strings.Contains(stderr, "--token") {
			t.Errorf("serve --listen %s without a token: exit %d, stderr %q; want 2 and one line naming --listen and --token", addr, code, stderr)
		}
	}
	if code, stderr := runExit(t.Context(), "--store", c.store, "serve", "--listen", "nonsense"); code != exitBadInput || !strings.Contains(stderr, "--listen") {
		t.Errorf("serve --listen nonsense: exit %d, stderr %q", code, stderr)
	}
	if _, err := os.Stat(c.path); !os.IsNotExist(err) {
		t.Errorf("a refused serve created the store: %v", err)
	}
}

// TestServeLoopbackStartsAndStops: a loopback address needs no token; the
// server stops cleanly when its context ends. (Not parallel: it clears
// LEASEPOOL_TOKEN.)
func TestServeLoopbackStartsAndStops(t *testing.T) {
	c := setup(t)
	t.Setenv("LEASEPOOL_TOKEN", "")
	for _, addr := range []string{"127.0.0.1:0", "localhost:0"} {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		code, stderr := runExit(ctx, "--store", c.store, "serve", "--listen", addr)
		cancel()
		if code != exitOK || !strings.Contains(stderr, "serving the HTTP API") {
			t.Errorf("serve --listen %s: exit %d, stderr %q; want 0 after serving", addr, code, stderr)
		}
	}
}

// TestServeBasicAuth: --basic-auth USER:PASSWORD also lets serve listen on
// a non-loopback address; a malformed one is refused naming the flag.
// (Not parallel: it clears LEASEPOOL_TOKEN and LEASEPOOL_BASIC_AUTH.)
func TestServeBasicAuth(t *testing.T) {
	c := setup(t)
	t.Setenv("LEASEPOOL_TOKEN", "")
	t.Setenv("LEASEPOOL_BASIC_AUTH", "")
	for _, bad := range []string{"ops", "ops:", ":pw"} {
		code, stderr := runExit(t.Context(), "--store", c.store, "serve", "--listen", "0.0.0.0:0", "--basic-auth", bad)
		if code != exitBadInput || !strings.Contains(stderr, "--basic-auth") {
			t.Errorf("serve --basic-auth %q: exit %d, stderr %q; want 2 naming --basic-auth", bad, code, stderr)
		}
	}
	code, stderr := runExit(t.Context(), "--store", c.store, "serve", "--listen", "0.0.0.0:8080")
	if code != exitBadInput || !strings.Contains(stderr, "--basic-auth") {
		t.Errorf("serve --listen 0.0.0.0:8080 without auth: exit %d, stderr %q; want 2 naming --basic-auth", code, stderr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	code, stderr = runExit(ctx, "--store", c.store, "serve", "--listen", "0.0.0.0:0", "--basic-auth", "ops:pw")
	if code != exitOK || !strings.Contains(stderr, "serving the HTTP API") {
		t.Errorf("serve --listen 0.0.0.0:0 --basic-auth ops:pw: exit %d, stderr %q; want 0 after serving", code, stderr)
	}
}
