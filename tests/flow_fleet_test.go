package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// TestDeviceFleetExample runs examples/devices-fleet.json (five updates in
// parallel, each verified, a fan-in that tolerates two failures) twice at
// once on simulated devices over Mosquitto, through two `leasepool worker`
// processes: (a) one device fails every command: the flow succeeds and
// nothing is rolled back; (b) two devices fail their update and a third
// its self-test: the flow fails, and exactly the devices whose update
// succeeded get their rollback command, once each, after their update.
func TestDeviceFleetExample(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	url := sharedBroker(t)
	leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	sfx := randomSuffix(t)
	prefix := "lp" + sfx
	// Devices 0-4 are fleet (a), 5-9 fleet (b).
	behave := map[int]device.Behavior{
		2: {Fail: true},
		6: {Fail: true}, 7: {Fail: true}, 8: {Fail: true, Succeed: []string{"update"}},
	}
	sim := startSim(t, ctx, device.Config{
		BrokerURL: url, Prefix: prefix, IDPrefix: "fl-" + sfx + "-", Count: 10,
		Latency: 50 * time.Millisecond, Heartbeat: time.Second, Seed: 3,
		Behavior: func(i int) device.Behavior { return behave[i] },
	})
	for i := range 2 {
		deviceWorker(t, storeURL, fmt.Sprintf("fl%d-%s", i+1, sfx), url, prefix)
	}
	awaitOnline(t, ctx, store, 10)

	devs := sim.Devices()
	publish := func(key string, first int) {
		b, err := os.ReadFile("../examples/devices-fleet.json")
		if err != nil {
			t.Fatal(err)
		}
		for n := 5; n >= 1; n-- {
			b = []byte(strings.ReplaceAll(string(b), fmt.Sprintf(`"pump-%d"`, n), fmt.Sprintf("%q", devs[first+n-1].ID())))
		}
		spec, err := flow.ParseSpec(strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		spec.Key = key
		none := 0
		for i := range spec.Steps {
			st := &spec.Steps[i]
			if st.StepType() == flow.TypeSleep {
				st.Sleep = task.Duration(200 * time.Millisecond)
				continue
			}
			// Short device timeouts and no retries: a failing device's
			// command fails at once.
			for _, a := range []*flow.Action{&st.Action, st.Rollback} {
				if a == nil {
					continue
				}
				var c mqttdev.Command
				if err := json.Unmarshal(a.Payload, &c); err != nil {
					t.Fatal(err)
				}
				c.AckTimeout, c.ResultTimeout, c.MaxPublishes = task.Duration(time.Second), task.Duration(3*time.Second), 3
				if a.Payload, err = json.Marshal(c); err != nil {
					t.Fatal(err)
				}
				a.Retries = &none
			}
		}
		if err := mqttdev.PrepareFlow(&spec); err != nil {
			t.Fatal(err)
		}
		if _, _, err := flow.Publish(ctx, store, spec); err != nil {
			t.Fatal(err)
		}
	}
	publish("fleet-a", 0)
	publish("fleet-b", 5)

	a, err := waitFlow(ctx, store, "fleet-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := waitFlow(ctx, store, "fleet-b")
	if err != nil {
		t.Fatal(err)
	}
	stepState := func(f *flow.Flow) string {
		var out []string
		for i, p := range f.Progress {
			out = append(out, f.Steps[i].Name+":"+string(p.State))
		}
		return strings.Join(out, " ")
	}
	if want := "update-1:succeeded update-2:succeeded update-3:failed update-4:succeeded update-5:succeeded " +
		"verify-1:succeeded verify-2:succeeded verify-3:skipped verify-4:succeeded verify-5:succeeded fleet-updated:succeeded"; a.State != flow.StateSucceeded || stepState(a) != want {
		t.Fatalf("fleet-a %s (%s):\n %s\nwant %s", a.State, a.Error, stepState(a), want)
	}
	if b.State != flow.StateFailed || !strings.Contains(b.Error, "3 of the 5 steps fleet-updated needs failed, more than its max_failed_needs (2)") {
		t.Fatalf("fleet-b %s (%s): %s", b.State, b.Error, stepState(b))
	}
	for i, want := range map[int]flow.StepState{0: flow.StepRolledBack, 1: flow.StepFailed, 2: flow.StepFailed, 3: flow.StepRolledBack, 4: flow.StepRolledBack, 7: flow.StepSkipped, 8: flow.StepFailed, 10: flow.StepSkipped} {
		if got := b.Progress[i].State; got != want {
			t.Errorf("fleet-b %s is %s, want %s (%s)", b.Steps[i].Name, got, want, stepState(b))
		}
	}

	// What the devices ran: rollbacks on exactly b's changed devices
	// (5, 8, 9), each once and after its update.
	rep := sim.Report()
	for _, o := range rep.Overlaps {
		t.Errorf("OVERLAP on %s: %s arrived while %s ran", o.Device, o.TaskKey, o.RunningTask)
	}
	var rolledBack []string
	updated := map[string]time.Time{}
	for _, r := range rep.Runs {
		if r.OK && r.Command == "update" && !strings.HasSuffix(r.TaskKey, "/undo") {
			updated[r.Device] = r.End
		}
	}
	for _, r := range rep.Runs {
		if !strings.HasSuffix(r.TaskKey, "/undo") {
			continue
		}
		if !r.OK || r.Start.Before(updated[r.Device]) {
			t.Errorf("rollback %s on %s: ok %v, started %s, its update ended %s", r.TaskKey, r.Device, r.OK, r.Start, updated[r.Device])
		}
		rolledBack = append(rolledBack, r.Device)
	}
	slices.Sort(rolledBack)
	if want := []string{devs[5].ID(), devs[8].ID(), devs[9].ID()}; !slices.Equal(rolledBack, want) {
		t.Fatalf("rollback commands ran on %v, want %v (the devices of fleet-b whose update succeeded)", rolledBack, want)
	}
}
