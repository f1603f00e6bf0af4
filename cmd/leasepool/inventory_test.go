package main

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestImpostorIsNewAndLeftOut is issue 38 on the command line: dev-0..4
// labelled ring=prod and approved by the operator, dev-9 announcing
// ring=prod with nobody vouching for it. `devices` shows dev-9 new, its
// ring an attribute and not a label; a rollout of ring=prod never takes
// it; forgetting it removes it until it announces itself again, new;
// approving and labelling it makes it a target.
func TestImpostorIsNewAndLeftOut(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, id := range []string{"dev-0", "dev-1", "dev-2", "dev-3", "dev-4"} {
		c.must("device", "label", id, "ring=prod")
	}
	if out := c.must("device", "approve", "--select", "ring=prod"); strings.Count(out, "vouched for by operator") != 5 {
		t.Fatalf("approve --select ring=prod:\n%s", out)
	}
	// dev-9 announces itself as a worker would record it.
	st, err := sqlitestore.Open(t.Context(), c.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := st.Now()
	if err := mqttdev.StoreStates(st).PutDeviceState(t.Context(), mqttdev.DeviceState{ID: "dev-9", Online: true, At: now, SeenAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := mqttdev.PutAttributes(t.Context(), st, "dev-9", mqttdev.Labels{"ring": "prod"}, now); err != nil {
		t.Fatal(err)
	}

	var infos []mqttdev.DeviceInfo
	if err := json.Unmarshal([]byte(c.must("devices", "--json")), &infos); err != nil || len(infos) != 6 {
		t.Fatalf("devices --json: %d devices, %v", len(infos), err)
	}
	if d := infos[5]; d.ID != "dev-9" || !d.New || len(d.Labels) != 0 || d.Attributes.String() != "ring=prod" {
		t.Fatalf("dev-9 listed as %+v: want new, ring=prod an attribute, no label", d)
	}
	if d := infos[0]; d.New || d.Vouched == nil || d.Labels.String() != "ring=prod" {
		t.Fatalf("dev-0 listed as %+v", d)
	}
	table := c.must("devices")
	if row := deviceRow(table, "dev-9"); !slices.Equal(row, []string{"dev-9", "online", "new", "-", "-", "-", "0", "-", "ring=prod"}) {
		t.Fatalf("dev-9's row %q, want it new with ring=prod under ATTRIBUTES only:\n%s", row, table)
	}
	if row := deviceRow(table, "dev-0"); !slices.Equal(row, []string{"dev-0", "unknown", "vouched", "-", "-", "-", "0", "ring=prod", "-"}) {
		t.Fatalf("dev-0's row %q:\n%s", row, table)
	}
	if out := c.must("devices", "--new"); deviceRow(out, "dev-9") == nil || deviceRow(out, "dev-0") != nil {
		t.Fatalf("devices --new:\n%s", out)
	}
	if out := c.must("devices", "--select", "attr:ring=prod"); deviceRow(out, "dev-9") == nil || deviceRow(out, "dev-0") != nil {
		t.Fatalf("devices --select attr:ring=prod:\n%s", out)
	}

	targets := func(name string) []string {
		t.Helper()
		r, err := rollout.Get(t.Context(), st, name)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range r.Devices {
			ids = append(ids, e.Device)
		}
		return ids
	}
	c.must("rollout", "create", "canary1", "--command", "update", "--select", "ring=prod", "--waves", "1,100%")
	if got := targets("canary1"); !slices.Equal(got, []string{"dev-0", "dev-1", "dev-2", "dev-3", "dev-4"}) {
		t.Fatalf("canary1 targets %v", got)
	}
	if _, err := c.run("rollout", "create", "canary-x", "--command", "update", "--select", "attr:ring=prod"); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "select") {
		t.Fatalf("a rollout by announced attribute: %v, want refused naming select", err)
	}

	// Labelled by mistake, dev-9 is still left out, and the rollout says so.
	c.must("device", "label", "dev-9", "ring=prod")
	c.must("rollout", "create", "canary2", "--command", "update", "--select", "ring=prod")
	if got := targets("canary2"); slices.Contains(got, "dev-9") {
		t.Fatalf("canary2 targets the new dev-9: %v", got)
	}
	if out := c.must("rollout", "show", "canary2"); !strings.Contains(out, "1 new device left out, not vouched for (leasepool device approve): dev-9") {
		t.Fatalf("rollout show does not name the device left out:\n%s", out)
	}
	// Forget: dev-9 goes, labels and all, until it announces itself
	// again, new.
	if out := c.must("device", "forget", "dev-9"); !strings.Contains(out, "dev-9 forgotten") {
		t.Fatalf("forget: %q", out)
	}
	if out := c.must("devices"); deviceRow(out, "dev-9") != nil {
		t.Fatalf("devices after forget:\n%s", out)
	}
	if _, err := c.run("device", "forget", "dev-9"); !errors.Is(err, task.ErrNotFound) || exitStatus(err) != exitFailed || !strings.Contains(err.Error(), "dev-9") {
		t.Fatalf("forget again: %v (exit %d), want not found naming dev-9", err, exitStatus(err))
	}
	if err := mqttdev.PutAttributes(t.Context(), st, "dev-9", mqttdev.Labels{"ring": "prod"}, st.Now()); err != nil {
		t.Fatal(err)
	}
	if row := deviceRow(c.must("devices"), "dev-9"); !slices.Equal(row, []string{"dev-9", "unknown", "new", "-", "-", "-", "0", "-", "ring=prod"}) {
		t.Fatalf("dev-9 back as %q, want new without the label it had", row)
	}
	c.must("device", "label", "dev-9", "ring=prod")
	if out := c.must("device", "approve", "dev-9", "--by", "alice"); !strings.Contains(out, "dev-9 vouched for by alice") {
		t.Fatalf("approve dev-9: %q", out)
	}
	c.must("rollout", "create", "canary3", "--command", "update", "--select", "ring=prod")
	if got := targets("canary3"); !slices.Contains(got, "dev-9") || len(got) != 6 {
		t.Fatalf("canary3 targets %v, want dev-9 among 6 once approved", got)
	}
}

// deviceRow returns the fields of id's row in a `devices` table, nil if
// it has none.
func deviceRow(table, id string) []string {
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == id {
			return f
		}
	}
	return nil
}

// A selector of != terms alone matches every device without those
// labels, and a device that just announced itself has none: `approve
// --select ring!=prod` would vouch for every new device. It is refused,
// naming select, and nothing is vouched for; with a k=v term beside it,
// it approves what that term names.
func TestApproveSelectNeedsAPositiveTerm(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("device", "label", "dev-0", "ring=prod")
	c.must("device", "label", "dev-1", "ring=canary")
	st, err := sqlitestore.Open(t.Context(), c.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// dev-9 announced itself, through any broker that reaches a worker.
	if err := mqttdev.PutAttributes(t.Context(), st, "dev-9", mqttdev.Labels{"ring": "canary"}, st.Now()); err != nil {
		t.Fatal(err)
	}
	for _, sel := range []string{"ring!=prod", "ring!=prod,zone!=eu"} {
		_, err := c.run("device", "approve", "--select", sel)
		if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), "--select") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("approve --select %s: %v (exit %d), want a one-line bad input error naming --select", sel, err, exitStatus(err))
		}
	}
	if out := c.must("devices", "--new"); deviceRow(out, "dev-9") == nil || deviceRow(out, "dev-1") == nil {
		t.Fatalf("a refused approve vouched for devices:\n%s", out)
	}
	if out := c.must("device", "approve", "--select", "ring=canary,ring!=prod"); !strings.Contains(out, "dev-1 vouched for") || strings.Contains(out, "dev-9") || strings.Contains(out, "dev-0") {
		t.Fatalf("approve --select ring=canary,ring!=prod:\n%s", out)
	}
}
