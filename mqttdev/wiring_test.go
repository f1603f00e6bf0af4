package mqttdev

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestWireEmbeddedBroker: with no broker URL, Wire hosts the embedded
// broker by lease, registers a handler that runs a command on a simulated
// device through it, gives the inventory entries stored before index
// terms their terms, and Stop closes the broker.
func TestWireEmbeddedBroker(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 30*time.Second)
	path := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, id := range []string{"old-1", "old-2"} {
		if _, err := SetLabels(ctx, store, id, LabelChange{Set: Labels{"ring": "prod"}}); err != nil {
			t.Fatal(err)
		}
	}
	forgetTerms(t, path)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	mux := consumer.NewMux()
	prefix := "w" + NewCorrelationID()[:12]
	w, err := Wire(ctx, WireConfig{Mux: mux, Store: store, WorkerID: prefix + "-worker", EmbeddedBroker: addr,
		EmbeddedBrokerLease: time.Second, Prefix: prefix, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	if w.Host == nil || !slices.Contains(mux.Kinds(), Kind) {
		t.Fatalf("host %v, mux kinds %v: want a broker host and the device kind registered", w.Host, mux.Kinds())
	}
	testutil.Eventually(t, 10*time.Second, "the broker hosted here", w.Host.Hosting)
	testutil.Eventually(t, 10*time.Second, "the inventory's old entries indexed", func() bool {
		docs, err := store.DocumentsByTerms(ctx, InventoryNamespace, []string{"label:ring=prod"})
		return err == nil && len(docs) == 2 && docs[0].Terms != nil && docs[1].Terms != nil
	})
	secret, err := credential.Add(ctx, store, prefix+"-dev-0", false)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := device.NewSimulator(device.Config{BrokerURL: w.Host.URL(), Prefix: prefix, IDPrefix: prefix + "-dev-", Count: 1,
		Secrets: map[string]string{prefix + "-dev-0": secret}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Stop(context.Background()) })
	dev := sim.Device(0).ID()
	testutil.Eventually(t, 10*time.Second, "the device online at the worker", func() bool {
		s, ok := w.Handler.Tracker().State(dev)
		return ok && s.Online
	})
	if err := mux.Handle(ctx, job("wired-1", 1, Command{Device: dev, Command: "x"})); err != nil {
		t.Fatalf("device command through the wiring: %v", err)
	}
	if err := w.Handler.Start(ctx); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("second Start of the handler = %v, want ErrStarted", err)
	}
	for range 2 {
		if err := w.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if w.Host.Hosting() {
		t.Fatal("still hosting the broker after Stop")
	}
	if err := w.Handler.Handle(ctx, job("wired-2", 1, Command{Device: dev, Command: "x"})); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Handle after Stop = %v, want ErrNotStarted", err)
	}
}

func TestWireConfigRequired(t *testing.T) {
	t.Parallel()
	if _, err := Wire(context.Background(), WireConfig{}); err == nil {
		t.Fatal("Wire without mux, store and worker id: no error")
	}
}
