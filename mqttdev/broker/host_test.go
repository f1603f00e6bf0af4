package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// accepting reports whether an MQTT broker answers on addr: an MQTT
// 3.1.1 CONNECT gets a CONNACK. (A bare dial is not used: mochi-mqtt
// v2.7.9 races between setting up an accepted connection and Close, which
// the race detector reports if a probe's connection is still being set up
// when the test closes the broker.)
func accepting(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	connect := []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 60, 0, 1, 'p'}
	if _, err := c.Write(connect); err != nil {
		return false
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil {
		return false
	}
	return ack[0] == 0x20
}

// brokerHostSetup opens one SQLite store file twice (as two processes
// would) and returns a constructor of hosts on addr, each with its own
// store handle, stopped when t ends.
func brokerHostSetup(t *testing.T, lease time.Duration) (addr string, newHost func(id string) *Host, probe task.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.db")
	open := func() task.Store {
		s, err := sqlitestore.Open(context.Background(), path, nil)
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	probe = open()
	addr = freeAddr(t)
	newHost = func(id string) *Host {
		h, err := NewHost(HostConfig{
			Store: open(), Addr: addr, WorkerID: id, Lease: lease, Anonymous: true,
			Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With(slog.String("host", id)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Stop(context.Background()) })
		return h
	}
	return addr, newHost, probe
}

// TestBrokerHostTakeover: two hosts on one store; the first hosts, the
// second does not while the first lives; the first is stopped without
// releasing its lease (a crash) and the second hosts within about a lease.
func TestBrokerHostTakeover(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	addr, newHost, _ := brokerHostSetup(t, lease)

	h1 := newHost("w1")
	testutil.Eventually(t, 2*time.Second, "w1 hosts the broker", func() bool { return h1.Hosting() && accepting(addr) })
	h2 := newHost("w2")
	// Over two leases w2 never hosts while w1 renews.
	testutil.Consistently(t, 2*lease, "w1 hosting alone while it holds the lease", func() bool { return h1.Hosting() && !h2.Hosting() })

	// Measured from before the stop: closing w1's broker takes a while on
	// a loaded machine, and w1's lease runs from its last renewal.
	crashed := time.Now()
	if err := h1.stop(context.Background(), false); err != nil { // no release: a crash
		t.Fatal(err)
	}
	if accepting(addr) {
		t.Fatal("w1's broker still accepts after its stop")
	}
	testutil.Eventually(t, 3*lease, "w2 hosts after w1 crashed", func() bool { return h2.Hosting() && accepting(addr) })
	took := time.Since(crashed)
	t.Logf("takeover after a crash: %s (lease %s)", took.Round(time.Millisecond), lease)
	if took > lease+lease/3+300*time.Millisecond {
		t.Errorf("takeover took %s, want within about one lease (%s)", took, lease)
	}
	if took < lease-lease/3-100*time.Millisecond {
		t.Errorf("takeover after %s, before w1's lease (%s, renewed every %s) can have run out", took, lease, lease/3)
	}

	// A graceful stop releases the lease: a third host takes over within
	// one polling period (a third of the lease), not a whole lease.
	h3 := newHost("w3")
	if err := h2.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = testutil.EventuallyTook(t, 2*lease, "w3 hosts after w2 stopped", func() bool { return h3.Hosting() && accepting(addr) })
	t.Logf("takeover after a graceful stop: %s", took.Round(time.Millisecond))
	if took > lease/3+300*time.Millisecond {
		t.Errorf("takeover after a release took %s, want within %s", took, lease/3)
	}
}

// TestBrokerHostLostLeaseCloses: a host whose lease is taken by another
// holder (here: freed and taken behind its back) closes its broker at its
// next renewal, and hosts again once the lease is free.
func TestBrokerHostLostLeaseCloses(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	addr, newHost, probe := brokerHostSetup(t, lease)
	h := newHost("w1")
	testutil.Eventually(t, 2*time.Second, "w1 hosts", func() bool { return h.Hosting() && accepting(addr) })

	ctx := context.Background()
	key := []string{LockKey(addr)}
	thief := task.Holder{TaskKey: "embedded-broker", WorkerID: "thief", Instance: "thief"}
	if err := probe.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: h.Holder()}); err != nil {
		t.Fatal(err)
	}
	now := probe.Now()
	if err := probe.AcquireLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: thief, Now: now, Until: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, lease, "w1 closes its broker after losing the lease", func() bool { return !h.Hosting() && !accepting(addr) })

	// While the thief holds it, acquiring as w1 fails with the thief named.
	var locked *task.LockedError
	err := probe.AcquireLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: h.Holder(), Now: probe.Now(), Until: probe.Now().Add(lease)})
	if !errors.As(err, &locked) || locked.Holder != thief {
		t.Fatalf("acquire as w1 while the thief holds: %v", err)
	}
	if err := probe.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: thief}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, lease, "w1 hosts again once the lease is free", func() bool { return h.Hosting() && accepting(addr) })
}

// TestBrokerHostBindRetry: a host that holds the lease while another
// program holds the address keeps trying, and serves once it is free.
func TestBrokerHostBindRetry(t *testing.T) {
	t.Parallel()
	addr, newHost, _ := brokerHostSetup(t, 600*time.Millisecond)
	squatter, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := newHost("w1")
	testutil.Consistently(t, 300*time.Millisecond, "no hosting while another listener holds the address", func() bool { return !h.Hosting() })
	squatter.Close()
	took := testutil.EventuallyTook(t, time.Second, "w1 hosts once the address is free", func() bool { return h.Hosting() && accepting(addr) })
	t.Logf("bound %s after the address was freed", took.Round(time.Millisecond))
}

func TestHostConfig(t *testing.T) {
	t.Parallel()
	s := &sqlitestore.Store{}
	for _, c := range []HostConfig{
		{Addr: "127.0.0.1:1883", Anonymous: true},
		{Store: s, Addr: "127.0.0.1:0", Anonymous: true},
		{Store: s, Addr: "10.1.2.3:1883", Anonymous: true},
		{Store: s, Addr: "127.0.0.1:1883", Lease: 100 * time.Millisecond, Anonymous: true},
		{Store: s, Addr: "127.0.0.1:1883"}, // neither credentials nor anonymous
	} {
		if _, err := NewHost(c); err == nil {
			t.Errorf("NewHost(%+v): no error", c)
		}
	}
}
