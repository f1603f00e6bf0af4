package mqttdev

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// hostileIDs are device ids ValidateID refuses that MQTT still carries as
// one topic level (no NUL, no wildcard, no "/").
var hostileIDs = []string{" ", "a b", ".", "..", "dev\u202e1", "dev\u200f", "dev\u200e", "dev\u2066", "dev\ufeff", "dev\u00a0"}

func TestBadIDStatusNeverReachesTheInventory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	testBadIDStatus(t, ctx, b.URL())
}

func TestBadIDStatusNeverReachesTheInventoryMosquitto(t *testing.T) {
	t.Parallel()
	url := os.Getenv("LEASEPOOL_TEST_MQTT_URL")
	if url == "" {
		t.Fatal("LEASEPOOL_TEST_MQTT_URL is empty: start the test servers first (tests/servers up) so that it points at Mosquitto")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testBadIDStatus(t, ctx, url)
}

// testBadIDStatus publishes retained online statuses, with attributes, on
// the status topics of hostile ids and then of one good device, through
// the broker at url: a worker's tracker, its store and the inventory, and
// an admin tool reading the retained statuses afterwards, know the good
// device only.
func testBadIDStatus(t *testing.T, ctx context.Context, url string) {
	prefix := "ids" + NewCorrelationID()[:12]
	st := openInventoryStore(t)
	h, err := NewHandler(HandlerConfig{ClientConfig: ClientConfig{BrokerURL: url, ClientID: prefix + "-worker"},
		Prefix: prefix, DeviceState: StoreStates(st), Inventory: StoreInventory(st), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(context.Background()) })

	pub, err := protocol.NewClient(ClientConfig{BrokerURL: url}, protocol.ClientOptions{Role: "admin", CleanSession: true, OnMessage: func(Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer pub.Disconnect()
	topics := Topics{Prefix: prefix}
	status, _ := json.Marshal(Status{Online: true, At: time.Now(), Attributes: Labels{"ring": "canary"}})
	good := "dev-ok"
	for _, id := range append(slices.Clone(hostileIDs), good) {
		if err := pub.Publish(ctx, topics.Device(id, TopicStatus), true, status); err != nil {
			t.Fatalf("publish status of %q: %v", id, err)
		}
		// Retained messages outlive the test on a shared broker.
		t.Cleanup(func() { _ = pub.Publish(context.Background(), topics.Device(id, TopicStatus), true, nil) })
	}

	// One publisher's messages reach the worker in order: once the good
	// device is in the inventory, every hostile status was handled before.
	testutil.Eventually(t, 10*time.Second, good+" in the inventory", func() bool {
		inv, err := GetInventory(ctx, st, good)
		return err == nil && inv.Attributes["ring"] == "canary"
	})
	testutil.Eventually(t, 10*time.Second, good+" state stored", func() bool {
		docs, err := st.Documents(ctx, StateNamespace)
		return err == nil && len(docs) > 0
	})
	wantOnly := func(where string, ids []string) {
		t.Helper()
		if !slices.Equal(ids, []string{good}) {
			t.Errorf("%s: devices %q, want only %q", where, ids, good)
		}
	}
	var tracked []string
	for _, s := range h.Tracker().States() {
		tracked = append(tracked, s.ID)
	}
	wantOnly("worker's tracker", tracked)
	wantOnly("stored states", docIDs(t, st, StateNamespace))
	wantOnly("inventory", docIDs(t, st, InventoryNamespace))
	sel, _ := ParseSelector("attr:ring=canary")
	canary, err := Select(ctx, st, sel)
	if err != nil {
		t.Fatal(err)
	}
	wantOnly("selection attr:ring=canary", append(canary.Devices, canary.New...))

	// An admin tool subscribing now gets every retained status at once.
	states, err := ReadStates(ctx, ClientConfig{BrokerURL: url}, prefix, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	for _, s := range states.States() {
		read = append(read, s.ID)
	}
	wantOnly("ReadStates", read)
}

func docIDs(t *testing.T, st task.Store, ns string) []string {
	t.Helper()
	docs, err := st.Documents(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range docs {
		ids = append(ids, d.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestBadIDMessagesDropped hands the worker's message router status and
// reply messages of every refused id, those a broker would refuse to carry
// (NUL, newline) included: none is tracked, stored or routed.
func TestBadIDMessagesDropped(t *testing.T) {
	t.Parallel()
	st := openInventoryStore(t)
	h, err := NewHandler(HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "tcp://127.0.0.1:1"},
		DeviceState: StoreStates(st), Inventory: StoreInventory(st)})
	if err != nil {
		t.Fatal(err)
	}
	status, _ := json.Marshal(Status{Online: true, At: time.Now(), Attributes: Labels{"ring": "canary"}})
	ids := append(slices.Clone(hostileIDs), "dev\x00", "dev\n", "dev\x7f", "dev\u0085", "\xff")
	for _, id := range ids {
		h.onMessage(Message{Topic: h.topics.Device(id, TopicStatus), Payload: status, Retained: true})
		h.Tracker().Observe(id, Status{Online: true, At: time.Now()}, time.Now())
	}
	if got := h.Tracker().States(); len(got) != 0 {
		t.Fatalf("tracker holds %+v, want nothing", got)
	}
	ctx := context.Background()
	if err := PutAttributes(ctx, st, "dev\u202e1", Labels{"ring": "canary"}, time.Now()); err == nil {
		t.Fatal("PutAttributes of dev\\u202e1: stored")
	}
	// An inventory document written around the checks is selected by no
	// rollout.
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: InventoryNamespace, ID: " ",
		Value: json.RawMessage(`{"labels":{"ring":"canary"}}`)}); err != nil {
		t.Fatal(err)
	}
	sel, _ := ParseSelector("ring=canary")
	if got, err := SelectDevices(ctx, st, sel); err != nil || len(got) != 0 {
		t.Fatalf("select ring=canary = %q %v, want none", got, err)
	}
}
