package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func openInventoryStore(t *testing.T) task.Store {
	t.Helper()
	st, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// startInventory starts an embedded broker and a Handler named clientID
// keeping device states and the inventory in a store of its own, all
// closed when t ends.
func startInventory(t *testing.T, ctx context.Context, clientID string) (task.Store, *broker.Broker, *Handler) {
	t.Helper()
	st := openInventoryStore(t)
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	h, err := NewHandler(HandlerConfig{ClientConfig: ClientConfig{BrokerURL: b.URL(), ClientID: clientID},
		DeviceState: StoreStates(st), Inventory: StoreInventory(st), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(context.Background()) })
	return st, b, h
}

// TestAnnouncedAttributesReachTheInventory runs simulated devices that
// announce attributes through a real broker to a handler keeping them in
// the store, then selects devices by them and by an operator's label.
func TestAnnouncedAttributesReachTheInventory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, b, h := startInventory(t, ctx, "inv-worker")
	sites := []string{"berlin", "paris"}
	sim, err := device.NewSimulator(device.Config{BrokerURL: b.URL(), Count: 3, IDPrefix: "inv-", Logger: testLogger(t),
		Attributes: func(i int, id string) Labels {
			return Labels{"model": "pump-x", "site": sites[i%2], "firmware": "1.0." + fmt.Sprint(i)}
		},
		Behavior: func(i int) device.Behavior { return device.Behavior{Offline: i == 2} },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Stop(context.Background()) })
	eventually(t, 10*time.Second, "three devices in the inventory", func() bool {
		invs, err := Inventories(ctx, st)
		return err == nil && len(invs) == 3 && invs["inv-2"].Attributes["site"] == "berlin"
	})
	eventually(t, 10*time.Second, "inv-2 offline", func() bool {
		s, ok := h.Tracker().State("inv-2")
		return ok && !s.Online
	})
	if _, err := SetLabels(ctx, st, "inv-0", LabelChange{Set: Labels{"site": "paris", "ring": "canary"}}); err != nil {
		t.Fatal(err)
	}
	sel, err := ParseSelector("model=pump-x,site=paris")
	if err != nil {
		t.Fatal(err)
	}
	got, err := SelectDevices(ctx, st, sel)
	if err != nil || fmt.Sprint(got) != "[inv-0 inv-1]" {
		t.Fatalf("select %s = %v %v", sel, got, err)
	}
	sel, _ = ParseSelector("ring!=canary")
	if got, _ := SelectDevices(ctx, st, sel); fmt.Sprint(got) != "[inv-1 inv-2]" {
		t.Fatalf("select ring!=canary = %v", got)
	}
	infos, err := StoredDevices(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range infos {
		if d.ID == "inv-0" && (d.Labels["ring"] != "canary" || d.Labels["firmware"] != "1.0.0") {
			t.Fatalf("devices listing %+v: want the announced firmware and the operator's ring", d)
		}
	}
	// A status whose attributes break the rules keeps its online state;
	// its attributes go nowhere.
	h.Tracker().Observe("hostile", Status{Online: true, At: time.Now(), Attributes: Labels{"a b": "x", "k": strings.Repeat("v", 200)}}, time.Now())
	time.Sleep(200 * time.Millisecond)
	if s, ok := h.Tracker().State("hostile"); !ok || !s.Online {
		t.Fatal("the hostile device's online state was dropped with its attributes")
	}
	if inv, err := GetInventory(ctx, st, "hostile"); err != nil || inv.Version != 0 {
		t.Fatalf("hostile attributes stored: %+v %v", inv, err)
	}
}

// TestDevicesDroppingRightAfterAnnouncingEndOffline: devices that announce
// themselves and drop at once (their wills follow their online statuses
// within a millisecond) end offline at the worker, every announcement in
// the inventory: the worker is subscribed when Start returns and hears
// each device's statuses in the order the broker sent them.
func TestDevicesDroppingRightAfterAnnouncingEndOffline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, b, h := startInventory(t, ctx, "drop-worker")
	const n = 20
	sim, err := device.NewSimulator(device.Config{BrokerURL: b.URL(), Count: n, IDPrefix: "drop-", Logger: testLogger(t),
		Attributes: func(i int, id string) Labels { return Labels{"serial": id} },
		Behavior:   func(int) device.Behavior { return device.Behavior{Offline: true} },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Stop(context.Background()) })
	// Once a device's will is in, nothing more comes from it: a status
	// or announcement the worker got wrong stays wrong.
	var stuck []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		invs, err := Inventories(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		stuck = stuck[:0]
		for _, d := range sim.Devices() {
			s, ok := h.Tracker().State(d.ID())
			if attrs := invs[d.ID()].Attributes; !ok || s.Online || attrs["serial"] != d.ID() {
				stuck = append(stuck, fmt.Sprintf("%s (seen %v, online %v, attributes %v)", d.ID(), ok, s.Online, attrs))
			}
		}
		if len(stuck) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5s, %d of %d devices not offline with their attributes: %v", len(stuck), n, stuck)
		}
	}
}

func TestLabelsRefuseHostileInputNamingTheField(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openInventoryStore(t)
	for _, args := range [][]string{
		nil, {"k"}, {"=v"}, {"k="}, {"-k=v"}, {"k=v,w"}, {"k=a b"}, {"k=\x00"}, {"ké=v"}, {"k=v", "k-"},
		{strings.Repeat("k", 64) + "=v"}, {"k=" + strings.Repeat("v", 129)}, {"k/x=v"}, {"k=v=w"}, {"-"},
	} {
		ch, err := ParseLabelArgs(args)
		if err == nil {
			_, err = SetLabels(ctx, st, "d1", ch)
		}
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "label") || strings.Contains(err.Error(), "\n") {
			t.Errorf("labels %q: %v, want a one-line invalid label error", args, err)
		}
	}
	if _, err := SetLabels(ctx, st, "a/#", LabelChange{Set: Labels{"k": "v"}}); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "device") {
		t.Errorf("hostile device id: %v", err)
	}
	many := LabelChange{Set: Labels{}}
	for i := range 33 {
		many.Set[fmt.Sprintf("k%d", i)] = "v"
	}
	if _, err := SetLabels(ctx, st, "d1", many); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("33 labels: %v", err)
	}
	if docs, _ := st.Documents(ctx, InventoryNamespace); len(docs) != 0 {
		t.Fatalf("refused label edits wrote %d documents", len(docs))
	}
	inv, err := SetLabels(ctx, st, "d1", LabelChange{Set: Labels{"site": "berlin", "ring": "a"}})
	if err != nil || inv.Labels.String() != "ring=a,site=berlin" {
		t.Fatalf("%+v %v", inv, err)
	}
	inv, err = SetLabels(ctx, st, "d1", LabelChange{Remove: []string{"ring"}})
	if err != nil || inv.Labels.String() != "site=berlin" || inv.Version != 2 {
		t.Fatalf("%+v %v", inv, err)
	}
	for _, bad := range []string{"", "k", "k=", "=v", "k==v", "k=v,,j=w", "k=v w", strings.Repeat("k=v,", 33) + "k=v"} {
		if _, err := ParseSelector(bad); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "select") {
			t.Errorf("ParseSelector(%q) = %v", bad, err)
		}
	}
}
