package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// deviceState reads device id's stored state, if any.
func deviceState(t *testing.T, ctx context.Context, store task.Store, id string) (mqttdev.DeviceState, bool) {
	t.Helper()
	ss, err := mqttdev.StoreStates(store).DeviceStates(ctx)
	if err != nil {
		t.Fatalf("device states: %v", err)
	}
	for _, s := range ss {
		if s.ID == id {
			return s, true
		}
	}
	return mqttdev.DeviceState{}, false
}

// TestDeviceOfflineThenOnline takes a device offline for 30 s before its
// command is published, through two worker processes and the shared
// Mosquitto. While it is away the command is held by the workers: no
// failure, no run, and at most two claims recorded (the workers hold it
// with no write once they know the device is offline). Once the device's
// online status is stored, the command starts within a second and runs
// once.
func TestDeviceOfflineThenOnline(t *testing.T) {
	t.Parallel()
	const outage = 30 * time.Second
	ctx := testContext(t, outage+time.Minute)
	url := sharedBroker(t)
	leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	sfx := randomSuffix(t)
	prefix := "lp" + sfx
	sim := startSim(t, ctx, device.Config{
		BrokerURL: url, Prefix: prefix, IDPrefix: "odev-" + sfx + "-", Count: 2,
		Latency: 20 * time.Millisecond, Heartbeat: time.Second, Seed: 5,
	})
	off, on := sim.Device(0), sim.Device(1)
	deviceWorker(t, storeURL, "o1-"+sfx, url, prefix)
	deviceWorker(t, storeURL, "o2-"+sfx, url, prefix)
	awaitOnline(t, ctx, store, 2)

	off.GoOffline(outage)
	wentAt := time.Now()
	eventually(t, 10*time.Second, "the workers to see the device offline (its will)", func() bool {
		st, ok := deviceState(t, ctx, store, off.ID())
		return ok && !st.Online
	})

	offKey, onKey := "cmd-offline-"+sfx, "cmd-online-"+sfx
	publishDevice(t, ctx, store, &devCmd{key: offKey, device: off.ID(), retries: 3}, shortCmd("reboot"))
	publishDevice(t, ctx, store, &devCmd{key: onKey, device: on.ID(), retries: 3}, shortCmd("reboot"))

	// While the device is away: the online device's command runs, this
	// one waits, nothing spent, nothing sent.
	// Back is an online status the device sent after its outage began: a
	// worker that subscribes late is first given the retained status from
	// before it, and may store that for a moment.
	var backSeen time.Time
	var atBack *task.Task
	// A stored online status is seen within a pace of this poll.
	testutil.EventuallyEvery(t, time.Until(wentAt.Add(outage+10*time.Second)), 25*time.Millisecond, fmt.Sprintf("the device to come back within 10s of its %s outage", outage), func() bool {
		tk, err := store.Get(ctx, offKey)
		if err != nil {
			t.Fatal(err)
		}
		if tk.State.Finished() || failures(tk) > 0 {
			t.Fatalf("command for the offline device ended %s with workers %+v while the device was away", tk.State, tk.Attempts)
		}
		for _, r := range sim.Report().Runs {
			if r.TaskKey == offKey {
				t.Fatalf("the offline device ran %s attempt %d at %s, before it was back", offKey, r.Attempt, r.Start.Format(time.StampMilli))
			}
		}
		if st, ok := deviceState(t, ctx, store, off.ID()); ok && st.Online && st.At.After(wentAt) {
			backSeen, atBack = time.Now(), tk
			return true
		}
		return false
	})
	if away := backSeen.Sub(wentAt); away < outage-time.Second || away > outage+2*time.Second {
		t.Errorf("the device was away %s; its outage was %s", away.Round(time.Millisecond), outage)
	}
	if claims := atBack.AttemptsStarted; claims > 2 {
		t.Errorf("%d claims recorded while the device was away %s; want at most 2 (held with no write)", claims, outage)
	}
	onTask, err := store.Get(ctx, onKey)
	if err != nil {
		t.Fatal(err)
	}
	if onTask.State != task.StateSucceeded {
		t.Errorf("the online device's command is %s after the other's outage: %+v", onTask.State, onTask.Attempts)
	}

	eventually(t, 15*time.Second, "the command to succeed once the device is back", func() bool {
		tk, err := store.Get(ctx, offKey)
		if err != nil {
			t.Fatal(err)
		}
		return tk.State.Finished()
	})
	tk, err := store.Get(ctx, offKey)
	if err != nil {
		t.Fatal(err)
	}
	if tk.State != task.StateSucceeded || tk.Attempts[0].State != task.AttemptSuccess {
		t.Fatalf("command for the device that came back ended %s with workers %+v; want a success", tk.State, tk.Attempts)
	}
	runs := checkDeviceRuns(t, sim.Report(), map[string]*task.Task{offKey: tk, onKey: onTask})
	if len(runs[offKey]) != 1 {
		t.Fatalf("device ran %s %d times, want once: %+v", offKey, len(runs[offKey]), runs[offKey])
	}
	// The workers hear the status and the store's copy of it about at
	// once; the poll above saw the stored copy within its pace.
	late := runs[offKey][0].Start.Sub(backSeen)
	if late > time.Second {
		t.Errorf("the device started the command %s after its online status; want within 1 s", late.Round(time.Millisecond))
	}
	t.Logf("away %s, %d claims while away, the device started the command %s after its online status was stored",
		backSeen.Sub(wentAt).Round(time.Millisecond), atBack.AttemptsStarted, late.Round(time.Millisecond))
}

// TestFlakyDevicesFinishOnTime: 30 commands to 3 simulated devices that
// drop offline for a second after 30 % of their commands, through one
// worker process and the shared Mosquitto, all succeed in under 10 s
// (about 3 s of work and outages), each run once by its device.
func TestFlakyDevicesFinishOnTime(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	url := sharedBroker(t)
	leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	sfx := randomSuffix(t)
	prefix := "lp" + sfx
	sim := startSim(t, ctx, device.Config{
		BrokerURL: url, Prefix: prefix, IDPrefix: "fl-" + sfx + "-", Count: 3,
		Latency: 20 * time.Millisecond, OfflineRate: 0.3, OfflineFor: time.Second, Heartbeat: time.Second, Seed: 7,
	})
	deviceWorker(t, storeURL, "f1-"+sfx, url, prefix)
	awaitOnline(t, ctx, store, 3)

	start := time.Now()
	for j := range 10 {
		for _, d := range sim.Devices() {
			c := shortCmd(fmt.Sprintf("op%d", j))
			c.ResultTimeout = task.Duration(5 * time.Second)
			publishDevice(t, ctx, store, &devCmd{key: fmt.Sprintf("%s-cmd-%02d", d.ID(), j), device: d.ID(), retries: 3}, c)
		}
	}
	eventually(t, 30*time.Second, "every command to finish", func() bool { return finished(countStates(t, ctx, store)) == 30 })
	took := time.Since(start)
	tasks := tasksByKey(t, ctx, store)
	for key, tk := range tasks {
		if tk.State != task.StateSucceeded {
			t.Errorf("%s ended %s: %+v", key, tk.State, tk.Attempts)
		}
	}
	runs := checkDeviceRuns(t, sim.Report(), tasks)
	for key := range tasks {
		if len(runs[key]) != 1 {
			t.Errorf("%s ran %d times on its device; want once", key, len(runs[key]))
		}
	}
	tot := sim.Report().Totals()
	t.Logf("30 commands in %s; %d outages of 1 s", took.Round(time.Millisecond), tot.Outages)
	if took > 10*time.Second {
		t.Errorf("30 commands took %s; want under 10 s", took.Round(time.Millisecond))
	}
}
