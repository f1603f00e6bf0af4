package broker_test

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestClientIDOwner(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		"dev-a":                        "dev-a",
		"dev-a/admin-1":                "dev-a",
		"leasepool-sim-dev-a":          "dev-a",
		"leasepool-sim-dev-a/x":        "dev-a",
		"leasepool-worker-w1":          "worker:w1",
		"leasepool-worker-w1/states-2": "worker:w1",
		"leasepool-worker-dev-a":       "worker:dev-a",
		"":                             "",
		"/dev-a":                       "",
	} {
		if got := broker.ClientIDOwner(id); got != want {
			t.Errorf("ClientIDOwner(%q) = %q, want %q", id, got, want)
		}
	}
}

// session connects once with a persistent session (clean off) and
// reports whether the broker had one for clientID already.
func session(t *testing.T, url, clientID, user, password string, cert *tls.Certificate, ca *testutil.CA, lost chan<- error) (c paho.Client, present bool, err error) {
	t.Helper()
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).SetCleanSession(false).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(5 * time.Second)
	if user != "" {
		o.SetUsername(user).SetPassword(password)
	}
	if cert != nil {
		o.SetTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), Certificates: []tls.Certificate{*cert}})
	}
	if lost != nil {
		o.SetConnectionLostHandler(func(_ paho.Client, err error) { lost <- err })
	}
	c = paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return nil, false, fmt.Errorf("connect %s: no answer", clientID)
	}
	if err := tok.Error(); err != nil {
		return nil, false, err
	}
	t.Cleanup(func() { c.Disconnect(50) })
	return c, tok.(*paho.ConnectToken).SessionPresent(), nil
}

// stillConnected fails t unless c completes a QoS 1 round trip.
func stillConnected(t *testing.T, c paho.Client, topic, who string) {
	t.Helper()
	if tok := c.Publish(topic, 1, false, "here"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil || !c.IsConnectionOpen() {
		t.Errorf("%s lost its connection to a refused client: %v", who, tok.Error())
	}
}

// TestBrokerCertTakeoverRefused: clients logged in by certificate (no
// user name) cannot take over each other's sessions, a worker's among
// them; the victims stay connected.
func TestBrokerCertTakeoverRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca := testutil.NewCA(t)
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(st), Refresh: time.Second,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.Issue(t, "broker", true)},
			ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, id := range []string{"dev-a", "dev-b"} {
		if _, err := credential.Add(ctx, st, id, false); err != nil {
			t.Fatal(err)
		}
	}
	devA, devB, w1 := ca.Issue(t, "dev-a", false), ca.Issue(t, "dev-b", false), ca.Issue(t, credential.WorkerUser("w1"), false)
	w2 := ca.Issue(t, credential.WorkerUser("w2"), false)

	a, _, err := session(t, b.URL(), "dev-a", "", "", &devA, &ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, _, err := session(t, b.URL(), "leasepool-worker-w1", "", "", &w1, &ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		clientID, who string
		cert          *tls.Certificate
	}{
		{"dev-a", "dev-b", &devB},
		{"dev-a/x", "dev-b", &devB},
		{"leasepool-sim-dev-a", "dev-b", &devB},
		{"leasepool-worker-w1", "dev-b", &devB},
		{"leasepool-worker-w1", "w2", &w2},
		{"dev-a", "w1", &w1},
	} {
		if _, _, err := session(t, b.URL(), c.clientID, "", "", c.cert, &ca, nil); err == nil {
			t.Errorf("%s took client id %s", c.who, c.clientID)
		}
	}
	stillConnected(t, a, "lp/devices/dev-a/status", "dev-a")
	stillConnected(t, w, "lp/devices/dev-a/cmd", "worker w1")
	if _, _, err := session(t, b.URL(), "leasepool-sim-dev-b", "", "", &devB, &ca, nil); err != nil {
		t.Errorf("dev-b on a client id of its own: %v", err)
	}
}

// TestBrokerClientIDSquatRefused: a device cannot hold a worker's or
// another device's client id, with or without a persistent session, and
// the rightful owners connect afterwards.
func TestBrokerClientIDSquatRefused(t *testing.T) {
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
	for _, c := range []struct{ clientID, user, password string }{
		{"leasepool-worker-w1", "dev-b", secretB},
		{"leasepool-worker-w1/x", "dev-b", secretB},
		{"dev-a", "dev-b", secretB},
		{"dev-a/admin", "dev-b", secretB},
		{"leasepool-sim-dev-a", "dev-b", secretB},
		{"leasepool-worker-w1", credential.WorkerUser("w2"), workerSecret},
		{"dev-a", credential.WorkerUser("w2"), workerSecret},
		{"leasepool-admin-host-1", credential.WorkerUser("w2"), workerSecret},
	} {
		if _, err := dial(t, b.URL(), c.clientID, c.user, c.password, "", nil, nil); err == nil {
			t.Errorf("%s took client id %s (clean session)", c.user, c.clientID)
		}
		if _, _, err := session(t, b.URL(), c.clientID, c.user, c.password, nil, nil, nil); err == nil {
			t.Errorf("%s took client id %s (persistent session)", c.user, c.clientID)
		}
	}
	if _, present, err := session(t, b.URL(), "leasepool-worker-w1", credential.WorkerUser("w1"), workerSecret, nil, nil, nil); err != nil || present {
		t.Errorf("worker w1 after the squatters: session present %v, error %v; want a fresh session", present, err)
	}
	if _, present, err := session(t, b.URL(), "dev-a", "dev-a", secretA, nil, nil, nil); err != nil || present {
		t.Errorf("dev-a after the squatters: session present %v, error %v; want a fresh session", present, err)
	}
	mustDial(t, b.URL(), "leasepool-worker-w1/states", credential.WorkerUser("w1"), workerSecret, nil)
	mustDial(t, b.URL(), "leasepool-sim-dev-a", "dev-a", secretA, nil)
}

// TestBrokerRevokeRemovesPersistedSessions: revoking a device removes its
// persisted session, queued commands included, so that a credential made
// later for the same id starts afresh; other devices' persisted sessions
// stay.
func TestBrokerRevokeRemovesPersistedSessions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const refresh = 200 * time.Millisecond
	st, b := authSetup(t, refresh)
	secrets := map[string]string{}
	for _, id := range []string{"dev-a", "dev-b", "dev-c"} {
		s, err := credential.Add(ctx, st, id, false)
		if err != nil {
			t.Fatal(err)
		}
		secrets[id] = s
	}
	workerSecret, err := credential.WorkerSecret(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	// dev-a and dev-c leave persistent sessions subscribed to their
	// commands, and a command is queued for each.
	for _, id := range []string{"dev-a", "dev-c"} {
		c, _, err := session(t, b.URL(), id, id, secrets[id], nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok := c.Subscribe("lp/devices/"+id+"/cmd", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		c.Disconnect(50)
	}
	w := mustDial(t, b.URL(), "leasepool-worker-w1", credential.WorkerUser("w1"), workerSecret, nil)
	for _, id := range []string{"dev-a", "dev-c"} {
		if tok := w.Publish("lp/devices/"+id+"/cmd", 1, false, "queued"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
	}

	// A live connection of each revoked device shows when a refresh has
	// handled the revocation: dev-a's, then dev-b's revoked after it, so
	// that the refresh which handled dev-a's has ended.
	for _, id := range []string{"dev-a", "dev-b"} {
		lost := make(chan error, 1)
		if _, err := dial(t, b.URL(), id+"/live", id, secrets[id], "", nil, lost); err != nil {
			t.Fatal(err)
		}
		if err := credential.Revoke(ctx, st, id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-lost:
		case <-time.After(10 * refresh):
			t.Fatalf("revoked %s still connected after %s", id, 10*refresh)
		}
	}

	fresh, err := credential.Add(ctx, st, "dev-a", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, present, err := session(t, b.URL(), "dev-a", "dev-a", fresh, nil, nil, nil); err != nil || present {
		t.Errorf("dev-a with a new credential: session present %v, error %v; want the revoked session gone", present, err)
	}
	if _, present, err := session(t, b.URL(), "dev-c", "dev-c", secrets["dev-c"], nil, nil, nil); err != nil || !present {
		t.Errorf("dev-c: session present %v, error %v; want its persisted session kept", present, err)
	}
}
