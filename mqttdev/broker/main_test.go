package broker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tlogWriter sends log lines to t.Log.
type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func TestStartBrokerRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	if _, err := Listen(context.Background(), Config{Addr: "0.0.0.0:0", Anonymous: true}); err == nil {
		t.Fatal("listening on every interface was accepted")
	}
}

// TestBrokerStartStopContract: a second Start is an error, Stop closes the
// listener and may be called again.
func TestBrokerStartStopContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, err := Listen(ctx, Config{Addr: "127.0.0.1:0", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := b.Addr()
	if !accepting(addr) {
		t.Fatalf("broker on %s does not answer", addr)
	}
	if err := b.Start(ctx); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	for range 2 {
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if accepting(addr) {
		t.Fatal("broker still answers after Stop")
	}
}
