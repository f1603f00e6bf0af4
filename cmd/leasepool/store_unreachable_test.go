package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// A store nobody answers at fails the command in seconds with one line on
// stderr naming the host and why, its password hidden, and exit status 1.
func TestUnreachableStoreFailsInOneLine(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close() // nobody listens there now
	for _, tc := range []struct {
		url, want string
		inEnv     bool // given as LEASEPOOL_STORE, as a URL with a password should be
	}{
		{"mongodb://" + refused + "/", "store mongodb://" + refused + "/: cannot reach " + refused + " (connection refused)", false},
		{"mongodb://app:s3cret-pw@" + refused + "/jobs?authSource=admin",
			"store mongodb://app:xxxxx@" + refused + "/jobs?authSource=admin: cannot reach " + refused + " (connection refused)", true},
		{"mongodb://nosuchhost.invalid:27017/", "store mongodb://nosuchhost.invalid:27017/: cannot reach nosuchhost.invalid:27017 (", false},
	} {
		args := []string{"--store", tc.url, "ls"}
		if tc.inEnv {
			t.Setenv("LEASEPOOL_STORE", tc.url)
			args = []string{"ls"}
		}
		start := time.Now()
		stdout, stderr, code := runMain(t, "", args...)
		took := time.Since(start)
		if code != exitFailed || stdout != "" {
			t.Errorf("%s: exit %d, stdout %q; want exit %d and nothing printed", tc.url, code, stdout, exitFailed)
		}
		if line := strings.TrimSuffix(stderr, "\n"); strings.Contains(line, "\n") || !strings.Contains(line, tc.want) ||
			strings.Contains(line, "s3cret") || strings.Contains(line, "topology") {
			t.Errorf("%s: stderr %q, want one line holding %q and no password", tc.url, stderr, tc.want)
		}
		if took > 10*time.Second {
			t.Errorf("%s: failed after %s, want within seconds", tc.url, took)
		}
		t.Logf("%s: failed after %s", tc.url, took.Round(time.Millisecond))
	}
}
