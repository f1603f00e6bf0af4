package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
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
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	st, h := startInventoryAt(t, ctx, clientID, b.URL(), "")
	return st, b, h
}

// startInventoryAt is startInventory on the broker at url, under topic
// prefix (empty for DefaultPrefix).
func startInventoryAt(t *testing.T, ctx context.Context, clientID, url, prefix string) (task.Store, *Handler) {
	t.Helper()
	st := openInventoryStore(t)
	h, err := NewHandler(HandlerConfig{ClientConfig: ClientConfig{BrokerURL: url, ClientID: clientID}, Prefix: prefix,
		DeviceState: StoreStates(st), Inventory: StoreInventory(st), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(context.Background()) })
	return st, h
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
	testutil.Eventually(t, 10*time.Second, "three devices in the inventory", func() bool {
		invs, err := Inventories(ctx, st)
		return err == nil && len(invs) == 3 && invs["inv-2"].Attributes["site"] == "berlin"
	})
	testutil.Eventually(t, 10*time.Second, "inv-2 offline", func() bool {
		s, ok := h.Tracker().State("inv-2")
		return ok && !s.Online
	})
	if _, err := SetLabels(ctx, st, "inv-0", LabelChange{Set: Labels{"site": "paris", "ring": "canary"}}); err != nil {
		t.Fatal(err)
	}
	// Attributes and labels are apart: inv-0 announced site=berlin, its
	// operator labelled it site=paris.
	for _, tc := range []struct{ sel, want string }{
		{"attr:model=pump-x,attr:site=paris", "[inv-1]"},
		{"site=paris", "[inv-0]"},
		{"label:site=paris,attr:site=berlin", "[inv-0]"},
		{"ring!=canary", "[inv-1 inv-2]"},
		{"attr:site!=berlin", "[inv-1]"},
	} {
		sel, err := ParseSelector(tc.sel)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Select(ctx, st, sel)
		// Nobody vouched for any: all new, none selected.
		if err != nil || len(got.Devices) != 0 || fmt.Sprint(got.New) != tc.want {
			t.Fatalf("select %s = %+v %v, want new %s", sel, got, err, tc.want)
		}
	}
	infos, err := StoredDevices(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range infos {
		if d.ID == "inv-0" && (d.Labels.String() != "ring=canary,site=paris" || d.Attributes.String() != "firmware=1.0.0,model=pump-x,site=berlin" || !d.New) {
			t.Fatalf("devices listing %+v: want the announced attributes apart from the operator's labels, new", d)
		}
	}
	// A status whose attributes break the rules keeps its online state;
	// its attributes go nowhere.
	h.Tracker().Observe("hostile", Status{Online: true, At: time.Now(), Attributes: Labels{"a b": "x", "k": strings.Repeat("v", 200)}}, time.Now())
	if s, ok := h.Tracker().State("hostile"); !ok || !s.Online {
		t.Fatal("the hostile device's online state was dropped with its attributes")
	}
	testutil.Consistently(t, 200*time.Millisecond, "hostile attributes never stored", func() bool {
		inv, err := GetInventory(ctx, st, "hostile")
		return err == nil && inv.Version == 0
	})
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
	defer func() {
		if t.Failed() {
			t.Logf("%d of %d devices not offline with their attributes: %v", len(stuck), n, stuck)
		}
	}()
	testutil.Eventually(t, 5*time.Second, "every device offline with its attributes", func() bool {
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
		return len(stuck) == 0
	})
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
	for _, bad := range []string{"", "k", "k=", "=v", "k==v", "k=v,,j=w", "k=v w", strings.Repeat("k=v,", 33) + "k=v",
		"attr:", "attr:=v", "lable:k=v", "x:k=v", "attr:label:k=v", ":k=v", "attr:k!!=v"} {
		if _, err := ParseSelector(bad); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "select") {
			t.Errorf("ParseSelector(%q) = %v", bad, err)
		}
	}
	sel, err := ParseSelector(" label:ring=prod , attr:fw!=1:2,site=x")
	if err != nil || sel.String() != "ring=prod,attr:fw!=1:2,site=x" || len(sel.Attributes()) != 1 || sel.Attributes()[0].Key != "fw" {
		t.Fatalf("selector %+v %v", sel, err)
	}
	if !sel.Matches(Labels{"ring": "prod", "site": "x", "fw": "1:2"}, Labels{"fw": "1:3"}) || sel.Matches(Labels{"ring": "prod", "site": "x"}, Labels{"fw": "1:2"}) {
		t.Fatal("label and attribute terms read the wrong side")
	}
}
