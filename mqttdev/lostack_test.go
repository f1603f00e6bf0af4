package mqttdev

import (
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// TestOutageWithLostAckKeepsDevice is the interleaving behind a device
// overlap seen across a broker restart: the device accepts a copy of A's
// command but its ack never reaches the worker (lost, or queued in the
// worker's session while the worker reconnects), and meanwhile the worker
// sees the device offline (the broker sends the devices' wills when it
// stops) and back. A's last copy expires; the worker must not then give
// the attempt back (a snooze frees the device lock) while the device runs
// A: the next holder's command B would arrive while A runs. The worker asks
// the device again instead (same correlation id: a duplicate), and gets
// A's result once it has run.
func TestOutageWithLostAckKeepsDevice(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{DropAckRate: 1, Latency: 2 * time.Second}})
	ctx := ctxT(t, 30*time.Second)
	cmd := Command{Device: e.dev(0), Command: "x", AckTimeout: task.Duration(time.Second),
		ResultTimeout: task.Duration(5 * time.Second), MaxPublishes: 3}
	done := make(chan error, 1)
	go func() { done <- e.handler.Handle(ctx, job("A", 1, cmd)) }()
	testutil.Eventually(t, 10*time.Second, "A to run", func() bool { _, ok := e.sim.Device(0).Running(); return ok })
	// The worker sees the device drop and come back (its will, then its
	// online status), as across a broker restart.
	e.handler.Tracker().Observe(e.dev(0), Status{Online: false, At: time.Now()}, time.Now())
	time.Sleep(100 * time.Millisecond) // away a moment: the outage the test is about
	e.handler.Tracker().Observe(e.dev(0), Status{Online: true, At: time.Now()}, time.Now())

	err := <-done
	var sn *consumer.SnoozeError
	if errors.As(err, &sn) {
		// What the lock's next holder does at once: B arrives while A runs.
		_ = e.handler.Handle(ctx, job("B", 1, Command{Device: e.dev(0), Command: "y", AckTimeout: task.Duration(time.Second)}))
	}
	r := e.sim.Report()
	if len(r.Overlaps) != 0 {
		t.Fatalf("A = %v; overlaps %+v", err, r.Overlaps)
	}
	if err != nil {
		t.Fatalf("A = %v, want its result (the device ran it)", err)
	}
	if len(r.Runs) != 1 || r.Runs[0].TaskKey != "A" {
		t.Fatalf("runs %+v, want A once", r.Runs)
	}
}

// TestOutageWithLostAckDeviceStaysAway: the device accepted A (ack lost)
// and then stays offline. The worker holds the attempt (and so the device
// lock) while the device is away, up to result_timeout, and snoozes only
// then; it snoozes at once when the device comes back having not run it.
func TestOutageWithLostAckDeviceStaysAway(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{DropAckRate: 1, Latency: time.Hour}})
	ctx := ctxT(t, 30*time.Second)
	cmd := Command{Device: e.dev(0), Command: "x", AckTimeout: task.Duration(500 * time.Millisecond),
		ResultTimeout: task.Duration(2 * time.Second), MaxPublishes: 3}
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- e.handler.Handle(ctx, job("A", 1, cmd)) }()
	testutil.Eventually(t, 10*time.Second, "A to run", func() bool { _, ok := e.sim.Device(0).Running(); return ok })
	e.handler.Tracker().Observe(e.dev(0), Status{Online: false, At: time.Now()}, time.Now())
	err := <-done
	var sn *consumer.SnoozeError
	if !errors.As(err, &sn) {
		t.Fatalf("A = %v, want a snooze", err)
	}
	if took := time.Since(began); took < 2*time.Second {
		t.Fatalf("snoozed after %s, want the device awaited for result_timeout (2s) first", took)
	}
}
