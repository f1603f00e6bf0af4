package broker_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// authSetup starts a broker checking the credentials of a fresh store,
// re-read every refresh.
func authSetup(t *testing.T, refresh time.Duration) (task.Store, *broker.Broker) {
	t.Helper()
	st, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := broker.Listen(t.Context(), broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(st), Refresh: refresh})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return st, b
}

// received collects the messages a client gets.
type received struct {
	mu   sync.Mutex
	msgs []string // topic=payload
}

func (r *received) add(_ paho.Client, m paho.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m.Topic()+"="+string(m.Payload()))
}

func (r *received) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m == s {
			return true
		}
	}
	return false
}

func (r *received) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

// dial connects once (no retry, no reconnect) as user with password,
// with an optional will; the client is disconnected when t ends.
func dial(t *testing.T, url, clientID, user, password, will string, r *received, lost chan<- error) (paho.Client, error) {
	t.Helper()
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(5 * time.Second)
	if user != "" {
		o.SetUsername(user).SetPassword(password)
	}
	if will != "" {
		o.SetWill(will, "offline", 1, true)
	}
	if r != nil {
		o.SetDefaultPublishHandler(r.add)
	}
	if lost != nil {
		o.SetConnectionLostHandler(func(_ paho.Client, err error) { lost <- err })
	}
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return nil, fmt.Errorf("connect %s: no answer", clientID)
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(50) })
	return c, nil
}

func mustDial(t *testing.T, url, clientID, user, password string, r *received) paho.Client {
	t.Helper()
	c, err := dial(t, url, clientID, user, password, "", r, nil)
	if err != nil {
		t.Fatalf("%s as %q: %v", clientID, user, err)
	}
	return c
}

// TestBrokerRefusesUnknownClients: anonymous clients, unknown devices,
// wrong passwords, a worker without the cluster secret, a will on another
// device's topic are all refused; the device with its own secret and the worker with the
// cluster's get in.
func TestBrokerRefusesUnknownClients(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, b := authSetup(t, time.Second)
	secret, err := credential.Add(ctx, st, "dev-a", false)
	if err != nil {
		t.Fatal(err)
	}
	other, err := credential.Add(ctx, st, "dev-b", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := credential.Add(ctx, st, "dev-a", false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second Add of dev-a = %v, want it refused as existing", err)
	}
	// Before any worker made the cluster secret, no worker gets in.
	if _, err := dial(t, b.URL(), "leasepool-worker-w1", credential.WorkerUser("w1"), "guess", "", nil, nil); err == nil {
		t.Fatal("a worker got in before any worker secret existed")
	}
	workerSecret, err := credential.WorkerSecret(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := credential.WorkerSecret(ctx, st); err != nil || again != workerSecret {
		t.Fatalf("WorkerSecret again = %q, %v: want the same secret", again, err)
	}

	refused := []struct{ name, clientID, user, password, will string }{
		{"anonymous", "anon", "", "", ""},
		{"unknown device", "dev-z", "dev-z", secret, ""},
		{"impostor (wrong password)", "dev-a/impostor", "dev-a", "not-the-secret", ""},
		{"another device's secret", "dev-a/swapped", "dev-a", other, ""},
		{"empty password", "dev-a/empty", "dev-a", "", ""},
		{"worker with a device secret", "leasepool-worker-w1/bad", credential.WorkerUser("w1"), secret, ""},
		{"device posing as a worker", "dev-a/w-dev", "dev-a", workerSecret, ""},
		{"wildcard user name", "wild", "+", secret, ""},
		{"will on another device's topic", "dev-a/will-b", "dev-a", secret, "lp/devices/dev-b/status"},
		{"will on a command topic", "dev-a/will-cmd", "dev-a", secret, "lp/devices/dev-a/cmd"},
	}
	for _, c := range refused {
		if _, err := dial(t, b.URL(), c.clientID, c.user, c.password, c.will, nil, nil); err == nil {
			t.Errorf("%s: connected, want refused", c.name)
		}
	}
	if _, err := dial(t, b.URL(), "dev-a/will-own", "dev-a", secret, "lp/devices/dev-a/status", nil, nil); err != nil {
		t.Errorf("dev-a with a will on its own status: %v", err)
	}
	mustDial(t, b.URL(), "leasepool-worker-w1", credential.WorkerUser("w1"), workerSecret, nil)
}

// TestBrokerTopicRights: a device reaches only its own topics, a worker
// only the commands and the devices' replies; what is refused reaches no
// one.
func TestBrokerTopicRights(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, b := authSetup(t, time.Second)
	secretA, err := credential.Add(ctx, st, "dev-a", false)
	if err != nil {
		t.Fatal(err)
	}
	secretB, err := credential.Add(ctx, st, "dev-b", false)
	if err != nil {
		t.Fatal(err)
	}
	workerSecret, err := credential.WorkerSecret(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	var atWorker, atA, atB received
	w := mustDial(t, b.URL(), "leasepool-worker-w1", credential.WorkerUser("w1"), workerSecret, &atWorker)
	a := mustDial(t, b.URL(), "dev-a", "dev-a", secretA, &atA)
	bc := mustDial(t, b.URL(), "dev-b", "dev-b", secretB, &atB)

	subscribe := func(c paho.Client, filter string) byte {
		t.Helper()
		tok := c.Subscribe(filter, 1, nil)
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
		return tok.(*paho.SubscribeToken).Result()[filter]
	}
	for _, f := range []string{"lp/devices/+/status", "lp/devices/+/ack", "lp/devices/+/result"} {
		if q := subscribe(w, f); q != 1 {
			t.Fatalf("worker subscribe %s: granted %#x, want QoS 1", f, q)
		}
	}
	if q := subscribe(a, "lp/devices/dev-a/cmd"); q != 1 {
		t.Fatalf("dev-a subscribe to its commands: granted %#x", q)
	}
	if q := subscribe(bc, "lp/devices/dev-b/cmd"); q != 1 {
		t.Fatalf("dev-b subscribe to its commands: granted %#x", q)
	}
	for c, filters := range map[paho.Client][]string{
		a:  {"lp/devices/dev-b/cmd", "lp/devices/+/cmd", "lp/devices/#", "#", "lp/devices/dev-b/status", "$SYS/#"},
		w:  {"lp/devices/+/cmd", "#", "+/devices/+/status", "lp/devices/dev-a/+"},
		bc: {"lp/devices/dev-a/result"},
	} {
		for _, f := range filters {
			if q := subscribe(c, f); q != 0x80 {
				t.Errorf("subscribe %s: granted %#x, want refused (0x80)", f, q)
			}
		}
	}

	// Allowed: a device's own replies reach the worker, the worker's
	// command reaches its device only.
	publish := func(c paho.Client, topic, payload string) error {
		tok := c.Publish(topic, 1, false, payload)
		if !tok.WaitTimeout(2 * time.Second) {
			return fmt.Errorf("publish %s: no ack", topic)
		}
		return tok.Error()
	}
	if err := publish(a, "lp/devices/dev-a/status", "a-online"); err != nil {
		t.Fatal(err)
	}
	if err := publish(w, "lp/devices/dev-a/cmd", "run"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "dev-a's status at the worker and the command at dev-a", func() bool {
		return atWorker.has("lp/devices/dev-a/status=a-online") && atA.has("lp/devices/dev-a/cmd=run")
	})

	// Refused publishes: the broker drops the MQTT 3.1.1 client that
	// tries (it cannot refuse a single QoS 1 message otherwise).
	for _, p := range []struct {
		user, pass, topic string
	}{
		{"dev-a", secretA, "lp/devices/dev-b/status"},
		{"dev-a", secretA, "lp/devices/dev-b/result"},
		{"dev-a", secretA, "lp/devices/dev-a/cmd"},
		{"dev-a", secretA, "lp/other"},
		{credential.WorkerUser("w2"), workerSecret, "lp/devices/dev-a/status"},
		{credential.WorkerUser("w2"), workerSecret, "lp/devices/dev-a/result"},
	} {
		lost := make(chan error, 1)
		c, err := dial(t, b.URL(), broker.ClientID(p.user, "pub-"+strings.ReplaceAll(p.topic, "/", "_")), p.user, p.pass, "", nil, lost)
		if err != nil {
			t.Fatal(err)
		}
		_ = publish(c, p.topic, "forged")
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Errorf("%s published to %s and stayed connected", p.user, p.topic)
		}
	}
	// A last allowed round trip: anything forged would have come before.
	if err := publish(bc, "lp/devices/dev-b/result", "b-done"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "dev-b's result at the worker", func() bool { return atWorker.has("lp/devices/dev-b/result=b-done") })
	for _, r := range []*received{&atWorker, &atA, &atB} {
		for _, m := range r.all() {
			if strings.HasSuffix(m, "=forged") {
				t.Errorf("a refused publish was delivered: %s", m)
			}
		}
	}
}

// TestBrokerRevokeDisconnects: revoking a device's credential closes its
// connection within the refresh period, its will telling the workers it
// is gone, and it cannot log in again; a rotated credential ends the old
// secret the same way.
func TestBrokerRevokeDisconnects(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const refresh = 200 * time.Millisecond
	st, b := authSetup(t, refresh)
	secret, err := credential.Add(ctx, st, "dev-a", false)
	if err != nil {
		t.Fatal(err)
	}
	workerSecret, err := credential.WorkerSecret(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	var atWorker received
	w := mustDial(t, b.URL(), "leasepool-worker-w1", credential.WorkerUser("w1"), workerSecret, &atWorker)
	if tok := w.Subscribe("lp/devices/+/status", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	lost := make(chan error, 1)
	if _, err := dial(t, b.URL(), "dev-a", "dev-a", secret, "lp/devices/dev-a/status", nil, lost); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if err := credential.Revoke(ctx, st, "dev-a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
		t.Logf("revoked device disconnected after %s (refresh %s)", time.Since(revoked).Round(time.Millisecond), refresh)
	case <-time.After(10 * refresh):
		t.Fatalf("revoked device still connected after %s", 10*refresh)
	}
	if _, err := dial(t, b.URL(), "dev-a", "dev-a", secret, "", nil, nil); err == nil {
		t.Fatal("revoked device logged in again")
	}
	if err := credential.Revoke(ctx, st, "dev-a"); err == nil {
		t.Fatal("second Revoke: no error")
	}
	testutil.Eventually(t, 5*time.Second, "the revoked device's will at the worker", func() bool {
		return atWorker.has("lp/devices/dev-a/status=offline")
	})

	// Rotation: the old secret is cut off, the new one works.
	old, err := credential.Add(ctx, st, "dev-c", false)
	if err != nil {
		t.Fatal(err)
	}
	lostC := make(chan error, 1)
	if _, err := dial(t, b.URL(), "dev-c", "dev-c", old, "", nil, lostC); err != nil {
		t.Fatal(err)
	}
	fresh, err := credential.Rotate(ctx, st, "dev-c")
	if err != nil || fresh == old {
		t.Fatalf("Rotate = %q, %v: want a new secret", fresh, err)
	}
	select {
	case <-lostC:
	case <-time.After(10 * refresh):
		t.Fatal("device on a rotated-out secret still connected")
	}
	if _, err := dial(t, b.URL(), "dev-c/2", "dev-c", old, "", nil, nil); err == nil {
		t.Error("the rotated-out secret still logs in")
	}
	mustDial(t, b.URL(), "dev-c/3", "dev-c", fresh, nil)
	if _, err := credential.Rotate(ctx, st, "dev-none"); err == nil {
		t.Error("Rotate of a device without a credential: no error")
	}
}

// TestBrokerConfigNeedsCredentials: a broker neither checking credentials
// nor told to allow anonymous clients is refused.
func TestBrokerConfigNeedsCredentials(t *testing.T) {
	t.Parallel()
	if _, err := broker.New(broker.Config{Addr: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "credentials") {
		t.Fatalf("New without credentials = %v, want an error naming credentials", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := credential.Add(ctx, nil, "worker:x", false); err == nil {
		t.Fatal("a device id starting with worker: was accepted")
	}
}
