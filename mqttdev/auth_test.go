package mqttdev

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// wireAuthenticated wires a worker hosting the embedded broker, which
// checks the credentials in a store of its own.
func wireAuthenticated(t *testing.T, ctx context.Context, prefix string) (task.Store, *consumer.Mux, *Wiring) {
	t.Helper()
	store, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "store.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	mux := consumer.NewMux()
	w, err := Wire(ctx, WireConfig{Mux: mux, Store: store, WorkerID: prefix + "-worker", EmbeddedBroker: addr,
		EmbeddedBrokerLease: time.Second, Prefix: prefix, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	testutil.Eventually(t, 10*time.Second, "the broker hosted here", w.Host.Hosting)
	return store, mux, w
}

// forge connects once as user (no retry) and publishes payload to topic;
// it reports whether the broker let it connect and whether the connection
// survived the publish.
func forge(t *testing.T, url, user, password, topic string, payload []byte) (connected, survived bool) {
	t.Helper()
	lost := make(chan struct{}, 1)
	clientID := "forger-" + NewCorrelationID()[:8]
	if user != "" {
		clientID = broker.ClientID(user, clientID) // the embedded broker's rule: refused for nothing else
	}
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).
		SetConnectionLostHandler(func(paho.Client, error) { lost <- struct{}{} })
	if user != "" {
		o.SetUsername(user).SetPassword(password)
	}
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return false, false
	}
	defer c.Disconnect(50)
	c.Publish(topic, 1, true, payload).WaitTimeout(2 * time.Second)
	select {
	case <-lost:
		return true, false
	case <-time.After(3 * time.Second):
		return true, true
	}
}

// TestWireRefusesImpostors: on the embedded broker a worker wires by
// default, a device with its own credential runs a command end to end;
// an anonymous client, an impostor with a wrong password and a device
// speaking for another get nothing into the device states or the
// inventory.
func TestWireRefusesImpostors(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 60*time.Second)
	prefix := "a" + NewCorrelationID()[:12]
	store, mux, w := wireAuthenticated(t, ctx, prefix)
	dev, fake, other := prefix+"-real-0", prefix+"-fake", prefix+"-other"
	secret, err := credential.Add(ctx, store, dev, false)
	if err != nil {
		t.Fatal(err)
	}
	otherSecret, err := credential.Add(ctx, store, other, false)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := device.NewSimulator(device.Config{BrokerURL: w.Host.URL(), Prefix: prefix, IDPrefix: prefix + "-real-", Count: 1, Heartbeat: time.Minute,
		Secrets:    map[string]string{dev: secret},
		Attributes: func(int, string) Labels { return Labels{"ring": "canary"} }, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Stop(context.Background()) })
	testutil.Eventually(t, 10*time.Second, "the device online at the worker", func() bool {
		s, ok := w.Handler.Tracker().State(dev)
		return ok && s.Online
	})
	if err := mux.Handle(ctx, job("auth-1", 1, Command{Device: dev, Command: "x"})); err != nil {
		t.Fatalf("device command through the authenticated broker: %v", err)
	}

	forged, _ := Encode(Status{Online: true, At: time.Now().UTC(), Attributes: Labels{"ring": "prod"}})
	topics := Topics{Prefix: prefix}
	for _, f := range []struct {
		name, user, pass, topic string
		wantConnect             bool
	}{
		{"anonymous as a new device", "", "", topics.Device(fake, TopicStatus), false},
		{"impostor of the real device", dev, "wrong", topics.Device(dev, TopicStatus), false},
		{"unknown device", fake, secret, topics.Device(fake, TopicStatus), false},
		{"another device speaking for the real one", other, otherSecret, topics.Device(dev, TopicStatus), true},
		{"another device posing as a new one", other, otherSecret, topics.Device(fake, TopicStatus), true},
		{"another device sending a result for the real one", other, otherSecret, topics.Device(dev, TopicResult), true},
	} {
		connected, survived := forge(t, w.Host.URL(), f.user, f.pass, f.topic, forged)
		if connected != f.wantConnect || survived {
			t.Errorf("%s: connected %v, survived the publish %v; want connected %v and dropped", f.name, connected, survived, f.wantConnect)
		}
	}
	// The other device's own status, allowed, comes after anything forged
	// on the worker's connection.
	own, _ := Encode(Status{Online: true, At: time.Now().UTC(), Attributes: Labels{"ring": "lab"}})
	if connected, survived := forge(t, w.Host.URL(), other, otherSecret, topics.Device(other, TopicStatus), own); !connected || !survived {
		t.Fatalf("the other device publishing its own status: connected %v, survived %v", connected, survived)
	}
	testutil.Eventually(t, 10*time.Second, "the other device's own status in the inventory", func() bool {
		invs, err := Inventories(ctx, store)
		return err == nil && invs[other].Attributes["ring"] == "lab"
	})
	invs, err := Inventories(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := invs[fake]; ok {
		t.Errorf("a forged device reached the inventory: %+v", invs[fake])
	}
	if got := invs[dev].Attributes["ring"]; got != "canary" {
		t.Errorf("the real device's ring is %q in the inventory, want canary (forged prod)", got)
	}
	states, err := StoreStates(store).DeviceStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.ID != dev && s.ID != other {
			t.Errorf("a forged device reached the device states: %+v", s)
		}
	}
}
