package tests

import (
	"encoding/json"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
)

// TestImpostorIsNoRolloutTarget is issue 38 end to end on Mosquitto: a
// `leasepool worker` keeps the inventory; dev-0..dev-4 are labelled
// ring=prod and approved; `leasepool device simulate --attr ring=prod`,
// a device nobody vouched for, announces itself. A rollout of ring=prod
// runs on the five and never commands the impostor, which `devices`
// lists new with ring=prod among its attributes; forgotten, it is gone
// until it connects again, new; approved and labelled, the next rollout
// runs on it too.
func TestImpostorIsNoRolloutTarget(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	leasepoolBin(t)
	url := sharedBroker(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "imp" + randomSuffix(t)
	startDeviceWorker(t, storeURL, "imp-w0", prefix, "--mqtt", url)
	fleet := startSim(t, ctx, device.Config{BrokerURL: url, Prefix: prefix, Count: 5, IDPrefix: "dev-", Heartbeat: time.Minute,
		Attributes: func(int, string) mqttdev.Labels { return mqttdev.Labels{"model": "pump-x"} }})
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, code := runCLI(t, append([]string{"--store", storeURL}, args...)...)
		if code != 0 {
			t.Fatalf("leasepool %v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	for _, d := range fleet.Devices() {
		cli("device", "label", d.ID(), "ring=prod")
	}
	cli("device", "approve", "--select", "ring=prod")

	const impostor = "dev-x0"
	startImpostor := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(leasepoolBin(t), "device", "simulate", "--mqtt", url, "--prefix", prefix, "--id-prefix", "dev-x",
			"--attr", "ring=prod", "--heartbeat", "1h", "--duration", "2m")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopProcess(cmd) })
		return cmd
	}
	sim := startImpostor()
	devices := func() map[string]mqttdev.DeviceInfo {
		t.Helper()
		var list []mqttdev.DeviceInfo
		if err := json.Unmarshal([]byte(cli("devices", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		out := map[string]mqttdev.DeviceInfo{}
		for _, d := range list {
			out[d.ID] = d
		}
		return out
	}
	announced := func() bool {
		inv, err := mqttdev.GetInventory(ctx, store, impostor)
		return err == nil && inv.Attributes["ring"] == "prod"
	}
	eventually(t, 20*time.Second, "the impostor's announcement in the inventory", announced)
	all := devices()
	if d := all[impostor]; !d.New || len(d.Labels) != 0 || d.Attributes.String() != "ring=prod" || !d.Online {
		t.Fatalf("devices lists the impostor as %+v: want it online and new, ring=prod an attribute, no label", d)
	}
	for _, d := range fleet.Devices() {
		if got := all[d.ID()]; got.New || got.Labels.String() != "ring=prod" || got.Attributes.String() != "model=pump-x" {
			t.Fatalf("devices lists %s as %+v", d.ID(), got)
		}
	}

	done := func(name string) *rollout.Rollout {
		t.Helper()
		var r *rollout.Rollout
		eventually(t, 60*time.Second, "rollout "+name+" over", func() bool {
			var err error
			r, err = rollout.Get(ctx, store, name)
			return err == nil && r.State.Final()
		})
		if r.State != rollout.StateCompleted {
			t.Fatalf("rollout %s %s: %s", name, r.State, r.Reason)
		}
		return r
	}
	cli("rollout", "create", "canary1", "--command", "update", "--select", "ring=prod", "--waves", "1,100%", "--timeout", "10s")
	r := done("canary1")
	var targets []string
	for _, e := range r.Devices {
		targets = append(targets, e.Device)
	}
	if !slices.Equal(targets, []string{"dev-0", "dev-1", "dev-2", "dev-3", "dev-4"}) || r.Devices[0].Wave != 0 || r.Devices[1].Wave != 1 {
		t.Fatalf("canary1 ran on %v", r.Devices)
	}
	if n := len(fleet.Report().Runs); n != 5 {
		t.Errorf("the fleet ran %d commands, want 5", n)
	}
	if commanded(t, store, impostor) {
		t.Fatal("the impostor was sent a command")
	}

	// Forgotten: gone until it connects again, then new.
	cli("device", "forget", impostor)
	if _, ok := devices()[impostor]; ok {
		t.Fatal("the impostor is listed after forget")
	}
	stopProcess(sim)
	startImpostor()
	eventually(t, 20*time.Second, "the impostor back after reconnecting", func() bool {
		d, ok := devices()[impostor]
		return ok && d.New && d.Online && d.Attributes.String() == "ring=prod" && len(d.Labels) == 0
	})

	cli("device", "approve", impostor)
	cli("device", "label", impostor, "ring=prod")
	cli("rollout", "create", "canary2", "--command", "update", "--select", "ring=prod", "--timeout", "10s")
	r = done("canary2")
	if !slices.ContainsFunc(r.Devices, func(e rollout.Exec) bool { return e.Device == impostor && e.Outcome == rollout.OutcomeSucceeded }) {
		t.Fatalf("canary2, after approving the impostor: %+v", r.Devices)
	}
}

// commanded reports whether any device task in store is for device id.
func commanded(t *testing.T, store task.Store, id string) bool {
	t.Helper()
	for _, tk := range tasksByKey(t, t.Context(), store) {
		if c, err := mqttdev.DecodePayload(tk.Payload); err == nil && c.Device == id {
			return true
		}
	}
	return false
}

// stopProcess interrupts cmd and waits for it; a process already waited
// for is left alone.
func stopProcess(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
