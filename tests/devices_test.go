package tests

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// shortCmd is a device command with timeouts short enough for tests.
func shortCmd(name string) mqttdev.Command {
	return mqttdev.Command{
		Command:       name,
		Args:          json.RawMessage(`{"n":1}`),
		AckTimeout:    task.Duration(time.Second),
		ResultTimeout: task.Duration(3 * time.Second),
		MaxPublishes:  3,
	}
}

// TestDevicesEmbeddedBroker runs 100 device commands on ten simulated
// devices through three worker processes sharing one SQLite store and an
// embedded broker, SIGKILLs one worker mid-run, and checks that every
// command ended as its device and retry rules say, that no device ever had
// two commands at once or ran a stale attempt, and that on devices without
// faults the commands queued before the workers started ran in priority,
// then publish, order (logged only: not guaranteed across workers today).
func TestDevicesEmbeddedBroker(t *testing.T) {
	start := time.Now()
	ctx := testContext(t, 2*time.Minute)
	leasepoolBin(t) // build before the clock matters
	store, storeURL := openTestStore(t, ctx)

	brk, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(store)})
	if err != nil {
		t.Fatalf("embedded broker did not start: %v", err)
	}
	t.Cleanup(func() { brk.Close() })
	prefix := "lp" + randomSuffix(t)

	// Ten devices: six without faults, three flaky (failures, lost acks),
	// one that fails every command.
	// Heartbeat: long, so that devices publish their status once, on
	// connect, before any worker starts. (It also once kept a retained
	// publish away from a worker's wildcard subscribe: a data race of
	// mochi-mqtt v2.7.9 that internal/mochi fixes.)
	base := device.Config{BrokerURL: brk.URL(), Prefix: prefix, Latency: 30 * time.Millisecond, Heartbeat: time.Minute}
	clean, flaky, broken := base, base, base
	clean.IDPrefix, clean.Count, clean.Seed = "clean-", 6, 1
	flaky.IDPrefix, flaky.Count, flaky.Seed = "flaky-", 3, 2
	flaky.FailRate, flaky.DropAckRate = 0.15, 0.2
	broken.IDPrefix, broken.Count, broken.Seed = "broken-", 1, 3
	broken.FailRate, broken.Latency = 1, 10*time.Millisecond
	// Each device logs in with its own credential; the workers, given a
	// loopback --mqtt, with the store's worker secret.
	sims := []*device.Simulator{
		startSim(t, ctx, provisioned(t, ctx, store, clean)),
		startSim(t, ctx, provisioned(t, ctx, store, flaky)),
		startSim(t, ctx, provisioned(t, ctx, store, broken)),
	}
	var devices []string
	kindOf := map[string]string{}
	for _, s := range sims {
		for _, d := range s.Devices() {
			devices = append(devices, d.ID())
			kindOf[d.ID()] = strings.TrimSuffix(d.ID(), d.ID()[strings.LastIndex(d.ID(), "-")+1:])
		}
	}

	// Every command is queued before any worker starts, interleaved across
	// devices, with mixed priorities.
	const perDevice = 10
	cmds := map[string]*devCmd{}
	for j := range perDevice {
		for _, dev := range devices {
			dc := &devCmd{key: fmt.Sprintf("%s-%02d", dev, j), device: dev, priority: (j * 7) % 4, retries: 3}
			publishDevice(t, ctx, store, dc, shortCmd(fmt.Sprintf("op%d", j)))
			cmds[dc.key] = dc
		}
	}
	n := len(cmds)

	workers := []*workerProc{
		deviceWorker(t, storeURL, "w1", brk.URL(), prefix),
		deviceWorker(t, storeURL, "w2", brk.URL(), prefix),
		deviceWorker(t, storeURL, "w3", brk.URL(), prefix),
	}
	eventually(t, time.Minute, "a third of the commands to finish while w1 holds one", func() bool {
		return finished(countStates(t, ctx, store)) >= n/3 && heldBy(t, ctx, store, "w1")
	})
	workers[0].kill(t)
	t.Logf("killed w1 after %d of %d commands finished", finished(countStates(t, ctx, store)), n)
	eventually(t, time.Minute, "every command to finish", func() bool { return finished(countStates(t, ctx, store)) == n })

	tasks := tasksByKey(t, ctx, store)
	if len(tasks) != n {
		t.Fatalf("store holds %d tasks, published %d", len(tasks), n)
	}
	rep := sims[0].Report()
	for _, s := range sims[1:] {
		r := s.Report()
		rep.Devices = append(rep.Devices, r.Devices...)
		rep.Runs = append(rep.Runs, r.Runs...)
		rep.Overlaps = append(rep.Overlaps, r.Overlaps...)
		rep.StaleAttempts = append(rep.StaleAttempts, r.StaleAttempts...)
	}
	runs := checkDeviceRuns(t, rep, tasks)

	var succeeded, failed, takenOver int
	for key, tk := range tasks {
		dc := cmds[key]
		last := 0
		for _, w := range tk.Attempts {
			if w.Attempt <= last {
				t.Errorf("task %s: attempt numbers do not grow: %+v", key, tk.Attempts)
			}
			last = w.Attempt
			switch w.State {
			case task.AttemptExpired:
				takenOver++
				if w.WorkerID != "w1" {
					t.Errorf("task %s: live worker %s lost its lease (attempt %d)", key, w.WorkerID, w.Attempt)
				}
			case task.AttemptFail:
				if kindOf[dc.device] == "clean-" {
					t.Errorf("task %s on fault-free device %s: attempt %d by %s failed: %s", key, dc.device, w.Attempt, w.WorkerID, w.Error)
				}
			}
		}
		nsucc := 0
		for _, w := range tk.Attempts {
			if w.State == task.AttemptSuccess {
				nsucc++
			}
		}
		switch tk.State {
		case task.StateSucceeded:
			succeeded++
			if nsucc != 1 || failures(tk) > dc.retries {
				t.Errorf("task %s succeeded with %d successes and %d failures (retries %d): %+v", key, nsucc, failures(tk), dc.retries, tk.Attempts)
			}
			if kindOf[dc.device] == "broken-" {
				t.Errorf("task %s succeeded on a device that fails every command: %+v", key, tk.Attempts)
			}
		case task.StateFailed:
			failed++
			if kindOf[dc.device] == "clean-" {
				t.Errorf("task %s on fault-free device %s failed: %+v", key, dc.device, tk.Attempts)
			}
			if nsucc != 0 || failures(tk) != dc.retries+1 {
				t.Errorf("task %s failed with %d successes and %d failures, want 0 and %d (retries %d): %+v", key, nsucc, failures(tk), dc.retries+1, dc.retries, tk.Attempts)
			}
			for _, w := range tk.Attempts {
				if w.State == task.AttemptFail && !strings.Contains(w.Error, mqttdev.ErrDeviceFailed.Error()) {
					t.Logf("task %s attempt %d failed for another reason than the device: %s", key, w.Attempt, w.Error)
				}
			}
		default:
			t.Errorf("task %s ended %s (want succeeded or failed): %+v", key, tk.State, tk.Attempts)
		}
	}

	// Priority, then publish order, on fault-free devices: every command
	// was queued before the workers started, and a failure or takeover
	// only repeats a command that had already started.
	for _, dev := range devices {
		if kindOf[dev] != "clean-" {
			continue
		}
		var order []*devCmd
		first := map[string]time.Time{}
		for key, dc := range cmds {
			if dc.device == dev && len(runs[key]) > 0 {
				order = append(order, dc)
				first[key] = runs[key][0].Start
			}
		}
		slices.SortFunc(order, func(a, b *devCmd) int { return first[a.key].Compare(first[b.key]) })
		for i := 1; i < len(order); i++ {
			a, b := order[i-1], order[i]
			if a.priority < b.priority || (a.priority == b.priority && a.seq > b.seq) {
				var got []string
				for _, dc := range order {
					got = append(got, fmt.Sprintf("%s(p%d,seq%d)", dc.key, dc.priority, dc.seq))
				}
				// Not an error: the consumer does not enforce it across
				// workers (a locked task is retried at the holder's lease
				// end, and whichever claim reaches the free lock first
				// wins). Reported to the owners; kept as a diagnostic.
				t.Logf("NOTE: device %s ran commands out of priority/publish order: %s", dev, strings.Join(got, " "))
				break
			}
		}
	}
	tot := rep.Totals()
	t.Logf("%d commands: %d succeeded, %d failed; %d leases taken over from w1; devices received %d, ran %d (failed %d), dropped %d acks, %d duplicates, %d expired, %d stale refused; %s",
		n, succeeded, failed, takenOver, tot.Received, tot.Ran, tot.Failed, tot.DroppedAcks, tot.Duplicates, tot.Expired, len(rep.StaleAttempts), time.Since(start).Round(time.Millisecond))
}

// TestDevicesMosquittoRestart runs 50 device commands on five simulated
// devices through three worker processes and a private Mosquitto with
// persistence, restarts the broker mid-run, and checks that every command
// still succeeded, exactly as the devices ran it, with no overlap.
func TestDevicesMosquittoRestart(t *testing.T) {
	start := time.Now()
	ctx := testContext(t, 2*time.Minute)
	leasepoolBin(t)
	mosqURL, stopMosq, restartMosq := testservers.StartMosquitto(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "lp" + randomSuffix(t)
	sim := startSim(t, ctx, device.Config{
		BrokerURL: mosqURL, Prefix: prefix, IDPrefix: "rdev-", Count: 5,
		Latency: 150 * time.Millisecond, Heartbeat: time.Second, Seed: 4,
	})

	const perDevice = 10
	tasks0 := map[string]*devCmd{}
	for j := range perDevice {
		for _, d := range sim.Devices() {
			dc := &devCmd{key: fmt.Sprintf("%s-%02d", d.ID(), j), device: d.ID(), priority: j % 3, retries: 3}
			c := shortCmd(fmt.Sprintf("op%d", j))
			c.ResultTimeout = task.Duration(8 * time.Second)
			c.MaxPublishes = 8
			publishDevice(t, ctx, store, dc, c)
			tasks0[dc.key] = dc
		}
	}
	n := len(tasks0)
	for _, id := range []string{"r1", "r2", "r3"} {
		deviceWorker(t, storeURL, id, mosqURL, prefix)
	}
	eventually(t, time.Minute, "a third of the commands to succeed", func() bool {
		return countStates(t, ctx, store)[task.StateSucceeded] >= n/3
	})
	before := countStates(t, ctx, store)[task.StateSucceeded]
	down := time.Now()
	stopMosq()
	time.Sleep(500 * time.Millisecond) // the broker's outage, mid-command: the point
	restartMosq()
	t.Logf("mosquitto restarted after %d of %d commands succeeded; down %s", before, n, time.Since(down).Round(time.Millisecond))
	eventually(t, time.Minute, "every command to finish", func() bool { return finished(countStates(t, ctx, store)) == n })

	tasks := tasksByKey(t, ctx, store)
	if len(tasks) != n {
		t.Fatalf("store holds %d tasks, published %d", len(tasks), n)
	}
	retried := 0
	for key, tk := range tasks {
		if tk.State != task.StateSucceeded {
			t.Errorf("task %s ended %s: %+v", key, tk.State, tk.Attempts)
		}
		if f := failures(tk); f > 0 {
			retried++
			t.Logf("task %s: %d failed attempts before success: %+v", key, f, tk.Attempts)
		}
	}
	rep := sim.Report()
	runs := checkDeviceRuns(t, rep, tasks)
	for key := range tasks {
		if len(runs[key]) == 0 {
			t.Errorf("task %s finished but no device ran it", key)
		}
	}
	tot := rep.Totals()
	t.Logf("%d commands succeeded (%d needed a retry); devices received %d, ran %d, %d duplicates, %d expired, %d stale refused, %d outages; %s",
		n, retried, tot.Received, tot.Ran, tot.Duplicates, tot.Expired, len(rep.StaleAttempts), tot.Outages, time.Since(start).Round(time.Millisecond))
}

// TestDeviceIDInjectionRefused publishes device commands whose device id
// would break out of its topic level, through the CLI: each is refused
// with a one-line error naming the device field, and nothing is written.
func TestDeviceIDInjectionRefused(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	path := filepath.Join(t.TempDir(), "store.db")
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	storeURL := "sqlite:" + path
	for _, id := range []string{"a/b", "+", "#", "", "dev/+/x", "pump#7", "a\\nb", "x\\u0000y", "/", "a+"} {
		payload := `{"device":"` + id + `","command":"x"}`
		stdout, stderr, code := runCLI(t, "--store", storeURL, "--log-level", "error", "publish", "k", "--kind", "device", "--payload", payload)
		msg := strings.TrimRight(stderr, "\n")
		switch {
		case code == 0:
			t.Errorf("payload %s: exit 0, want refusal; stdout %q", payload, stdout)
		case strings.Contains(msg, "\n") || msg == "":
			t.Errorf("payload %s: want a one-line error, got %q", payload, stderr)
		case !strings.Contains(msg, "device"):
			t.Errorf("payload %s: error does not name the device field: %q", payload, msg)
		}
	}
	// A missing device field, and a valid one for contrast.
	if _, stderr, code := runCLI(t, "--store", storeURL, "publish", "k", "--kind", "device", "--payload", `{"command":"x"}`); code == 0 || !strings.Contains(stderr, "device") {
		t.Errorf("payload without device: exit %d, stderr %q", code, stderr)
	}

	s, err = sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all, err := s.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 0 {
		t.Fatalf("refused publishes wrote %d tasks: first %s %s", len(all), all[0].Key, all[0].Payload)
	}
	if _, stderr, code := runCLI(t, "--store", storeURL, "--log-level", "error", "publish", "k", "--kind", "device", "--payload", `{"device":"pump-7","command":"x"}`); code != 0 {
		t.Fatalf("valid device publish refused: %s", stderr)
	}
	if tk, err := s.Get(ctx, "k"); err != nil || !slices.Contains(tk.LockKeys, mqttdev.LockKey("pump-7")) {
		t.Fatalf("valid device publish: task %+v, err %v; want lock key %s", tk, err, mqttdev.LockKey("pump-7"))
	}
}
