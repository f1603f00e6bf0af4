package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// TestUnvouchedImpostorIsNotSelected: the operator labelled and vouched
// for five devices ring=prod; a device nobody vouched for announces
// ring=prod itself through the broker. A selector of the label takes the
// five only; the impostor is listed new, its announcement among its
// attributes and not its labels; forgetting it removes it until it
// announces again, new; vouching for it and labelling it makes it one of
// the selected. On the embedded broker and on Mosquitto.
func TestUnvouchedImpostorIsNotSelected(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		testImpostor(t, ctx, b.URL())
	})
	t.Run("mosquitto", func(t *testing.T) {
		t.Parallel()
		url := os.Getenv("LEASEPOOL_TEST_MQTT_URL")
		if url == "" {
			t.Fatal("LEASEPOOL_TEST_MQTT_URL is empty: start the test servers first (tests/servers up) so that it points at Mosquitto")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		testImpostor(t, ctx, url)
	})
}

func testImpostor(t *testing.T, ctx context.Context, url string) {
	prefix := "v" + NewCorrelationID()[:12]
	st, h := startInventoryAt(t, ctx, prefix+"-worker", url, prefix)
	startSim := func(cfg device.Config) *device.Simulator {
		t.Helper()
		cfg.BrokerURL, cfg.Prefix, cfg.Logger = url, prefix, testLogger(t)
		// Statuses only when connecting: what the test does decides
		// when the impostor announces itself again.
		cfg.Heartbeat = time.Hour
		sim, err := device.NewSimulator(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sim.Stop(context.Background()) })
		return sim
	}
	startSim(device.Config{Count: 5, IDPrefix: "dev-", Attributes: func(int, string) Labels { return Labels{"model": "pump-x"} }})
	for i := range 5 {
		id := fmt.Sprintf("dev-%d", i)
		if _, err := SetLabels(ctx, st, id, LabelChange{Set: Labels{"ring": "prod"}}); err != nil {
			t.Fatal(err)
		}
		if err := Vouch(ctx, st, id, "operator"); err != nil {
			t.Fatal(err)
		}
	}
	impostor := startSim(device.Config{Count: 1, IDPrefix: "dev-x", Attributes: func(int, string) Labels { return Labels{"ring": "prod"} }})
	const id = "dev-x0"
	testutil.Eventually(t, 10*time.Second, "the impostor's announcement in the inventory", func() bool {
		inv, err := GetInventory(ctx, st, id)
		return err == nil && inv.Attributes["ring"] == "prod"
	})

	prod, _ := ParseSelector("ring=prod")
	announced, _ := ParseSelector("attr:ring=prod")
	if got, err := Select(ctx, st, prod); err != nil || fmt.Sprint(got.Devices) != "[dev-0 dev-1 dev-2 dev-3 dev-4]" || len(got.New) != 0 {
		t.Fatalf("select ring=prod = %+v %v: want the five labelled devices, not the one announcing it", got, err)
	}
	if got, err := Select(ctx, st, announced); err != nil || len(got.Devices) != 0 || fmt.Sprint(got.New) != "["+id+"]" {
		t.Fatalf("select attr:ring=prod = %+v %v: want the impostor, left out as new", got, err)
	}
	d := storedDevice(t, ctx, st, id)
	if !d.New || d.Vouched != nil || len(d.Labels) != 0 || d.Attributes.String() != "ring=prod" || !d.Online {
		t.Fatalf("the impostor listed as %+v: want new and online, ring=prod among its attributes, no label", d)
	}
	if d := storedDevice(t, ctx, st, "dev-0"); d.New || d.Vouched == nil || d.Vouched.By != "operator" || d.Labels.String() != "ring=prod" || d.Attributes.String() != "model=pump-x" {
		t.Fatalf("dev-0 listed as %+v", d)
	}

	// Forget: gone from the inventory and the states, until it announces
	// itself again, new.
	if err := Forget(ctx, st, id); err != nil {
		t.Fatal(err)
	}
	if invs, err := Inventories(ctx, st); err != nil || len(invs) != 5 {
		t.Fatalf("after forget the inventory holds %d entries (%v), want 5", len(invs), err)
	}
	if states, err := StoreStates(st).DeviceStates(ctx); err != nil || slices.ContainsFunc(states, func(s DeviceState) bool { return s.ID == id }) {
		t.Fatalf("after forget the impostor's state is still stored (%v)", err)
	}
	if err := Forget(ctx, st, id); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("forget again: %v, want not found", err)
	}
	if err := Forget(ctx, st, "a/#"); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("forget a/#: %v", err)
	}
	// The worker heard this announcement before and holds it: still the
	// entry comes back.
	reconnects := impostorOnline(h, id)
	impostor.Device(0).GoOffline(50 * time.Millisecond)
	testutil.Eventually(t, 10*time.Second, "the impostor back in the inventory after reconnecting", func() bool {
		inv, err := GetInventory(ctx, st, id)
		return err == nil && inv.Attributes["ring"] == "prod" && impostorOnline(h, id) > reconnects
	})
	if d := storedDevice(t, ctx, st, id); !d.New || d.Attributes.String() != "ring=prod" {
		t.Fatalf("the impostor came back as %+v, want new with its attributes", d)
	}

	// An operator vouches for it and labels it: now it is selected.
	if _, err := VouchAt(ctx, st, id, "operator", time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, _ := Select(ctx, st, prod); slices.Contains(got.Devices, id) {
		t.Fatalf("vouched but not labelled, the impostor is selected by ring=prod: %+v", got)
	}
	if _, err := SetLabels(ctx, st, id, LabelChange{Set: Labels{"ring": "prod"}}); err != nil {
		t.Fatal(err)
	}
	if got, err := Select(ctx, st, prod); err != nil || fmt.Sprint(got.Devices) != "[dev-0 dev-1 dev-2 dev-3 dev-4 "+id+"]" {
		t.Fatalf("select ring=prod after approving = %+v %v", got, err)
	}
	// Unvouch (a revoked credential) makes it new again.
	if err := Unvouch(ctx, st, id); err != nil {
		t.Fatal(err)
	}
	if got, _ := Select(ctx, st, prod); slices.Contains(got.Devices, id) || !slices.Contains(got.New, id) {
		t.Fatalf("unvouched, select ring=prod = %+v", got)
	}
}

// impostorOnline counts the tracker's online states of id seen so far by
// their SeenAt: a later one means a new status.
func impostorOnline(h *Handler, id string) int64 {
	s, ok := h.Tracker().State(id)
	if !ok || !s.Online {
		return 0
	}
	return s.SeenAt.UnixNano()
}

func storedDevice(t *testing.T, ctx context.Context, st task.Store, id string) DeviceInfo {
	t.Helper()
	infos, err := StoredDevices(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range infos {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("%s not among the devices listed", id)
	return DeviceInfo{}
}

// TestVouchRefusesBadInputAndKeepsTheFirst: Vouch names the field it
// refuses and writes nothing; a second vouching keeps the first; a device
// vouched for ahead of its first status has an entry, not new.
func TestVouchRefusesBadInputAndKeepsTheFirst(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := openInventoryStore(t)
	for _, tc := range []struct{ id, by, field string }{
		{"a/#", "operator", "device"}, {"", "operator", "device"}, {"d1", "", "by"},
		{"d1", "op\nerator", "by"}, {"d1", string(make([]byte, MaxVouchedByLen+1)), "by"},
	} {
		if err := Vouch(ctx, st, tc.id, tc.by); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Vouch(%q, %q) = %v, want invalid naming %s", tc.id, tc.by, err, tc.field)
		}
	}
	if docs, _ := st.Documents(ctx, InventoryNamespace); len(docs) != 0 {
		t.Fatalf("refused vouchings wrote %d documents", len(docs))
	}
	if err := Vouch(ctx, st, "d1", "credential"); err != nil {
		t.Fatal(err)
	}
	inv, err := VouchAt(ctx, st, "d1", "operator", time.Now())
	if err != nil || inv.New() || inv.Vouched.By != "credential" || inv.Version != 1 {
		t.Fatalf("second vouching: %+v %v, want the first kept and nothing written", inv, err)
	}
	if d := storedDevice(t, ctx, st, "d1"); d.New || d.Vouched == nil {
		t.Fatalf("a provisioned device never seen is listed as %+v", d)
	}
}
