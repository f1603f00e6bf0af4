package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// TestDeviceSequences: 50 device job sequences (flows of 3 device commands)
// over 10 simulated devices that they share, run by three worker processes.
// Per device never two commands at once; a sequence waiting for a busy
// device is served in priority, then arrival order, across workers; a
// device taken offline mid-run holds up its own sequences, not the others,
// and they finish when it returns.
func TestDeviceSequences(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	url := sharedBroker(t)
	leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	sfx := randomSuffix(t)
	prefix := "lp" + sfx
	sim := startSim(t, ctx, device.Config{
		BrokerURL: url, Prefix: prefix, IDPrefix: "sq-" + sfx + "-", Count: 10,
		// Commands slow enough that each device's line stands: about five
		// steps wait per device at first, and the line order check needs
		// some waiting over its 500 ms margin (with quick commands a run
		// may find none and check nothing).
		Latency: 120 * time.Millisecond, Heartbeat: time.Second, Seed: 9,
	})
	for i := range 3 {
		deviceWorker(t, storeURL, fmt.Sprintf("sq%d-%s", i+1, sfx), url, prefix)
	}
	awaitOnline(t, ctx, store, 10)

	const n = 50
	rng := rand.New(rand.NewPCG(7, 7))
	devs := sim.Devices()
	for i := range n {
		spec, priority := flow.Spec{Key: fmt.Sprintf("seq-%02d", i)}, rng.IntN(4)
		for j, d := range rng.Perm(len(devs))[:3] {
			c := shortCmd(fmt.Sprintf("s%d", j))
			c.Device = devs[d].ID()
			payload, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			spec.Steps = append(spec.Steps, flow.Step{Name: fmt.Sprintf("s%d", j), Action: flow.Action{Kind: mqttdev.Kind, Payload: payload, Priority: priority}})
		}
		if err := mqttdev.PrepareFlow(&spec); err != nil {
			t.Fatal(err)
		}
		if _, _, err := flow.Publish(ctx, store, spec); err != nil {
			t.Fatal(err)
		}
	}

	// Take the busiest device away once the run is well under way.
	eventually(t, time.Minute, "a third of the commands to run", func() bool { return len(sim.Report().Runs) >= n })
	away := devs[0]
	const outage = 4 * time.Second
	offAt := time.Now()
	away.GoOffline(outage)
	backAt := offAt.Add(outage)
	// A real outage: the workers see the device's will, then its online
	// status within 2 s of the outage's end.
	states := mqttdev.StoreStates(store)
	awayOnline := func() bool {
		ss, err := states.DeviceStates(ctx)
		if err != nil {
			t.Fatalf("device states: %v", err)
		}
		for _, s := range ss {
			if s.ID == away.ID() {
				return s.Online
			}
		}
		return false
	}
	eventually(t, 10*time.Second, "the workers to see the device offline (its will)", func() bool { return !awayOnline() })
	eventually(t, time.Until(backAt)+2*time.Second, "the workers to see the device back online within 2 s of its outage's end", awayOnline)
	t.Logf("%s seen back online %s after its outage's end", away.ID(), time.Since(backAt).Round(time.Millisecond))

	eventually(t, 3*time.Minute, "every sequence to succeed", func() bool {
		fs, err := flow.List(ctx, store, flow.ListQuery{})
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, f := range fs {
			if f.State == flow.StateSucceeded {
				done++
			} else if f.State.Finished() {
				t.Fatalf("sequence %s ended %s: %s", f.Key, f.State, f.Error)
			}
		}
		return done == n
	})
	rep := sim.Report()
	for _, o := range rep.Overlaps {
		t.Errorf("OVERLAP on %s: %s#%d arrived while %s#%d ran", o.Device, o.TaskKey, o.Attempt, o.RunningTask, o.RunningAttempt)
	}
	steps := stepTasks(t, store, ctx)
	ok := map[string]int{}
	okAttempt := map[string]bool{}
	byDevice := map[string][]device.Run{}
	for _, r := range rep.Runs {
		if !r.OK {
			continue
		}
		if id := fmt.Sprintf("%s#%d", r.TaskKey, r.Attempt); okAttempt[id] {
			t.Errorf("%s ran twice on its device", id)
		} else {
			okAttempt[id] = true
		}
		ok[r.TaskKey]++
		byDevice[r.Device] = append(byDevice[r.Device], r)
	}
	again := 0
	for key, tk := range steps {
		switch dev := stepDevice(t, tk); {
		case ok[key] == 0:
			t.Errorf("step %s never ran on its device", key)
		case ok[key] > 1 && dev != away.ID():
			// A command whose result is lost (its device went away
			// mid-command) runs again: at least once, fenced by attempt.
			t.Errorf("step %s ran %d times on %s, which never went away", key, ok[key], dev)
		case ok[key] > 1:
			again++
		}
	}
	t.Logf("%d steps, %d run again after their device went away mid-command", len(steps), again)
	checkLineOrder(t, byDevice, steps, away.ID())
	checkOutage(t, byDevice, steps, away.ID(), offAt, backAt)
}

// stepPayload is a step task's own payload, out of its flow envelope.
func stepPayload(t *testing.T, tk *task.Task) json.RawMessage {
	t.Helper()
	var env struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(tk.Payload, &env); err != nil {
		t.Fatalf("%s: envelope: %v", tk.Key, err)
	}
	return env.Payload
}

// stepTasks returns the sequences' step tasks by key.
func stepTasks(t *testing.T, store task.Store, ctx context.Context) map[string]*task.Task {
	t.Helper()
	all, err := store.List(ctx, task.ListQuery{Kind: mqttdev.Kind})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*task.Task{}
	for _, tk := range all {
		out[tk.Key] = tk
	}
	return out
}

// checkLineOrder checks, on every device but skip, that each command that
// took the device outranked every command already waiting for it (waiting
// well before the device freed: published 500 ms before the previous
// command ended, and started after this one): priority, then publish
// order of the step, across every worker.
func checkLineOrder(t *testing.T, byDevice map[string][]device.Run, steps map[string]*task.Task, skip string) {
	t.Helper()
	const margin = 500 * time.Millisecond
	checked := 0
	for dev, runs := range byDevice {
		if dev == skip {
			continue
		}
		slices.SortFunc(runs, func(a, b device.Run) int { return a.Start.Compare(b.Start) })
		for k := 1; k < len(runs); k++ {
			took := steps[runs[k].TaskKey]
			freed := runs[k-1].End
			for _, later := range runs[k+1:] {
				w := steps[later.TaskKey]
				if !w.CreatedAt.Before(freed.Add(-margin)) {
					continue
				}
				checked++
				if w.Priority > took.Priority || (w.Priority == took.Priority && w.Seq < took.Seq) {
					t.Errorf("device %s: %s (priority %d, seq %d) took it while %s (priority %d, seq %d) waited ahead",
						dev, took.Key, took.Priority, took.Seq, w.Key, w.Priority, w.Seq)
				}
			}
		}
	}
	t.Logf("line order: %d waiting pairs checked on %d devices", checked, len(byDevice)-1)
	if checked == 0 {
		t.Fatal("no command ever waited for a busy device: the test checked nothing")
	}
}

// checkOutage checks that the device that went away ran nothing while
// away, that its commands ran again after it came back, and that no other
// device stood idle during the outage while a step for it waited: a step
// published before an idle spell of over 1.5 s began, first run after
// it ended.
func checkOutage(t *testing.T, byDevice map[string][]device.Run, steps map[string]*task.Task, away string, offAt, backAt time.Time) {
	t.Helper()
	const idle = 1500 * time.Millisecond
	firstRun := map[string]time.Time{}
	for _, runs := range byDevice {
		for _, r := range runs {
			if f, ok := firstRun[r.TaskKey]; !ok || r.Start.Before(f) {
				firstRun[r.TaskKey] = r.Start
			}
		}
	}
	others, after := 0, 0
	for dev, runs := range byDevice {
		slices.SortFunc(runs, func(a, b device.Run) int { return a.Start.Compare(b.Start) })
		free := offAt // when dev was last seen free during the outage
		for _, r := range runs {
			switch {
			case dev == away && r.Start.After(offAt) && r.Start.Before(backAt):
				t.Errorf("%s ran %s while offline", dev, r.TaskKey)
			case dev == away && r.Start.After(backAt):
				after++
			case dev != away && r.Start.After(offAt) && r.Start.Before(backAt):
				others++
			}
			if dev == away || r.End.Before(offAt) || free.After(backAt) {
				continue
			}
			if gap := earliest(r.Start, backAt).Sub(free); gap > idle {
				for key, tk := range steps {
					if c := stepDevice(t, tk); c == dev && tk.CreatedAt.Before(free) && !firstRun[key].Before(r.Start) {
						t.Errorf("%s stood idle %s into the outage of %s (%s) while %s waited for it since %s before",
							dev, free.Sub(offAt).Round(time.Millisecond), away, gap.Round(time.Millisecond), key, free.Sub(tk.CreatedAt).Round(time.Millisecond))
					}
				}
			}
			if r.End.After(free) {
				free = r.End
			}
		}
	}
	t.Logf("outage of %s: %d commands ran on other devices meanwhile, %d on it after it returned", away, others, after)
	if others == 0 {
		t.Error("no other device ran a command during the outage: sequences for other devices were held up")
	}
	if after == 0 {
		t.Error("the device ran nothing after it returned")
	}
}

// stepDevice is the device a step task commands.
func stepDevice(t *testing.T, tk *task.Task) string {
	t.Helper()
	c, err := mqttdev.DecodePayload(stepPayload(t, tk))
	if err != nil {
		t.Fatal(err)
	}
	return c.Device
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
