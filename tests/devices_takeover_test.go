package tests

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// mqttAccepting reports whether an MQTT broker answers on addr: an MQTT
// 3.1.1 CONNECT (clean session) gets an accepting CONNACK.
func mqttAccepting(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
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
	// The broker refuses this anonymous login (return code 5), and so
	// answers.
	return ack[0] == 0x20
}

// brokerHosts returns the workers whose logs say they host the embedded
// broker (each hosting start is one line).
func brokerHosts(t *testing.T, logs map[string]string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for id, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "embedded MQTT broker hosted here"); n > 0 {
			out[id] = n
		}
	}
	return out
}

// TestDevicesEmbeddedBrokerTakeover runs 120 device commands on ten
// simulated devices through three worker processes sharing one SQLite store
// and the embedded broker (no --mqtt: the workers host it among
// themselves), SIGKILLs the worker hosting the broker once a tenth of the
// commands succeeded, and checks that a surviving worker hosts it again
// within about one broker lease, that devices and workers reconnect, and
// that every command succeeded: no attempt failed (none burned by a broker
// that vanished), only the killed worker's leases expired, no device ran
// two commands at once or a stale attempt.
func TestDevicesEmbeddedBrokerTakeover(t *testing.T) {
	start := time.Now()
	ctx := testContext(t, 90*time.Second)
	leasepoolBin(t) // build before the clock matters
	store, storeURL := openTestStore(t, ctx)
	prefix := "lp" + randomSuffix(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	const lease = broker.DefaultLease

	ids := []string{"w1", "w2", "w3"}
	workers, logs := map[string]*workerProc{}, map[string]string{}
	for _, id := range ids {
		workers[id], logs[id] = startDeviceWorker(t, storeURL, id, prefix,
			"--embedded-broker", addr, "--embedded-broker-lease", lease.String())
	}
	eventually(t, 20*time.Second, "one worker to host the embedded broker", func() bool {
		return len(brokerHosts(t, logs)) == 1 && mqttAccepting(addr)
	})
	if h := brokerHosts(t, logs); len(h) != 1 {
		t.Fatalf("workers hosting the broker: %v, want exactly one", h)
	}

	// Heartbeat long: devices publish their status once, on connect.
	sim := startSim(t, ctx, provisioned(t, ctx, store, device.Config{
		BrokerURL: "tcp://" + addr, Prefix: prefix, IDPrefix: "dev-", Count: 10, Seed: 1,
		// Slow enough that most commands are still to run at the kill.
		Latency: 500 * time.Millisecond, Heartbeat: time.Minute,
	}))
	var devices []string
	for _, d := range sim.Devices() {
		devices = append(devices, d.ID())
	}
	const perDevice = 12
	cmds := map[string]*devCmd{}
	for j := range perDevice {
		for _, dev := range devices {
			dc := &devCmd{key: fmt.Sprintf("%s-%02d", dev, j), device: dev, retries: 3}
			publishDevice(t, ctx, store, dc, shortCmd(fmt.Sprintf("op%d", j)))
			cmds[dc.key] = dc
		}
	}
	n := len(cmds)

	// A tenth, so the kill lands while a quarter are still to run even
	// when this process is slow to see it: ten devices finish about 20
	// commands a second, so that allows a stall of almost 4 s. (A quarter
	// as the mark and half as the bound failed after a stall of 1.5 s on a
	// busy machine, a tenth and half after one of 2.6 s.) Without a broker
	// no command runs, so the ones left all wait for the takeover, and
	// one is enough to show it.
	eventually(t, 30*time.Second, "a tenth of the commands to succeed", func() bool {
		return countStates(t, ctx, store)[task.StateSucceeded] >= n/10
	})
	var host string
	for id := range brokerHosts(t, logs) {
		host = id
	}
	killedAt := workers[host].kill(t)
	before := countStates(t, ctx, store)[task.StateSucceeded]
	t.Logf("killed %s, the broker's host, after %d of %d commands succeeded", host, before, n)
	if left := n - before; left < n/4 {
		t.Fatalf("%d of %d commands succeeded before the kill: %d left, too few to show the takeover", before, n, left)
	}

	// Takeover: the broker accepts again, hosted by a survivor, and a
	// command succeeds after that.
	eventually(t, lease+5*time.Second, "the broker to accept again", func() bool { return mqttAccepting(addr) })
	accepting := time.Since(killedAt)
	atAccept := countStates(t, ctx, store)[task.StateSucceeded]
	eventually(t, 15*time.Second, "a command to succeed after the takeover", func() bool {
		return countStates(t, ctx, store)[task.StateSucceeded] > atAccept
	})
	nextSuccess := time.Since(killedAt)
	hosts := brokerHosts(t, logs)
	delete(hosts, host)
	if len(hosts) != 1 {
		t.Errorf("survivors hosting the broker: %v, want exactly one", hosts)
	}
	t.Logf("takeover (lease %s): broker accepting %s after the kill, next command succeeded %s after the kill; new host %v",
		lease, accepting.Round(time.Millisecond), nextSuccess.Round(time.Millisecond), hosts)
	if accepting > lease+time.Second {
		t.Errorf("broker accepting %s after its host was killed, want within about one lease (%s)", accepting, lease)
	}

	eventually(t, 40*time.Second, "every command to finish", func() bool { return finished(countStates(t, ctx, store)) == n })
	tasks := tasksByKey(t, ctx, store)
	if len(tasks) != n {
		t.Fatalf("store holds %d tasks, published %d", len(tasks), n)
	}
	checkDeviceRuns(t, sim.Report(), tasks)
	var retaken int // claimed more than once: the killed worker's (its expired entries are dropped by the next claim)
	for key, tk := range tasks {
		if tk.AttemptsStarted > 1 {
			retaken++
		}
		if tk.State != task.StateSucceeded {
			t.Errorf("task %s ended %s, want succeeded: %+v", key, tk.State, tk.Attempts)
		}
		for _, w := range tk.Attempts {
			switch w.State {
			case task.AttemptFail:
				t.Errorf("task %s: attempt %d by %s failed: %s", key, w.Attempt, w.WorkerID, w.Error)
			case task.AttemptExpired:
				if w.WorkerID != host {
					t.Errorf("task %s: live worker %s lost its lease (attempt %d)", key, w.WorkerID, w.Attempt)
				}
			}
		}
	}
	tot := sim.Report().Totals()
	t.Logf("%d commands succeeded; %d claimed more than once (%s was killed); devices received %d, ran %d, %d duplicates, %d expired; %s",
		n, retaken, host, tot.Received, tot.Ran, tot.Duplicates, tot.Expired, time.Since(start).Round(time.Millisecond))
}
