package mongostore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task/mongostore"
)

// freePort returns an address of the loopback interface nobody listens on.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentServer accepts connections and never answers, as a host behind a
// firewall that drops the traffic would not even accept them.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// Open fails at once, in one line naming the server and why, when nothing
// listens there or its host does not exist; and within ConnectTimeout when
// the server never answers.
func TestOpenUnreachable(t *testing.T) {
	t.Parallel()
	refused := freePort(t)
	silent := silentServer(t)
	for _, tc := range []struct {
		uri, want string
		cfg       mongostore.Config
		within    time.Duration
	}{
		{"mongodb://" + refused + "/", "cannot reach " + refused + " (connection refused)", mongostore.Config{}, 3 * time.Second},
		{"mongodb://" + refused + "," + freePort(t) + "/?replicaSet=rs", "cannot reach " + refused + " (connection refused), ", mongostore.Config{}, 3 * time.Second},
		{"mongodb://nosuchhost.invalid:27017/", "cannot reach nosuchhost.invalid:27017 (", mongostore.Config{}, 8 * time.Second},
		{"mongodb://" + silent + "/", "cannot reach " + silent + " (no answer within 1s)", mongostore.Config{ConnectTimeout: time.Second}, 4 * time.Second},
		{"mongodb://" + silent + "/?serverSelectionTimeoutMS=1500", "cannot reach " + silent + " (no answer within 1.5s)", mongostore.Config{}, 5 * time.Second},
	} {
		start := time.Now()
		s, err := mongostore.Open(context.Background(), tc.uri, &tc.cfg)
		took := time.Since(start)
		if err == nil {
			s.Close()
			t.Fatalf("%s: Open succeeded", tc.uri)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, tc.want) || strings.Contains(msg, "\n") || strings.Contains(msg, "topology") {
			t.Errorf("%s: %q, want one line starting %q", tc.uri, msg, tc.want)
		}
		if took > tc.within {
			t.Errorf("%s: failed after %s, want within %s", tc.uri, took, tc.within)
		}
		if errors.Unwrap(err) == nil {
			t.Errorf("%s: %v wraps nothing, want the driver's error", tc.uri, err)
		}
	}
}
