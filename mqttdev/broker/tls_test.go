package broker_test

import (
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestBrokerClientCertificates: with a client CA, a client logs in by its
// certificate's common name, no password: a device needs a credential in
// the store too (revoking it drops the device), a worker's name needs
// only the certificate; a client without a certificate, or with one of
// another CA, or claiming another user name, is refused, and the topic
// rights hold as with passwords.
func TestBrokerClientCertificates(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, other := testutil.NewCA(t), testutil.NewCA(t)
	const refresh = 200 * time.Millisecond
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(st), Refresh: refresh,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.Issue(t, "broker", true)},
			ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := credential.Add(ctx, st, "dev-a", false); err != nil {
		t.Fatal(err)
	}

	connect := func(clientID, user string, cert *tls.Certificate, r *received, lost chan<- error) (paho.Client, error) {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool()}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		o := paho.NewClientOptions().AddBroker(b.URL()).SetClientID(clientID).SetTLSConfig(tc).
			SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
		if user != "" {
			o.SetUsername(user)
		}
		if r != nil {
			o.SetDefaultPublishHandler(r.add)
		}
		if lost != nil {
			o.SetConnectionLostHandler(func(_ paho.Client, err error) { lost <- err })
		}
		c := paho.NewClient(o)
		tok := c.Connect()
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			return nil, tok.Error()
		}
		t.Cleanup(func() { c.Disconnect(50) })
		return c, nil
	}
	devA, devZ, worker, foreign := ca.Issue(t, "dev-a", false), ca.Issue(t, "dev-z", false), ca.Issue(t, credential.WorkerUser("w1"), false), other.Issue(t, "dev-a", false)
	for _, c := range []struct {
		name string
		user string
		cert *tls.Certificate
	}{
		{"no certificate", "", nil},
		{"no certificate, a user name", "dev-a", nil},
		{"another CA's certificate", "", &foreign},
		{"a device without a credential", "", &devZ},
		{"a certificate claiming another user", "dev-b", &devA},
	} {
		if _, err := connect("dev-a/refused", c.user, c.cert, nil, nil); err == nil {
			t.Errorf("%s: connected, want refused", c.name)
		}
	}

	var atWorker received
	w, err := connect("leasepool-worker-w1", "", &worker, &atWorker, nil)
	if err != nil {
		t.Fatalf("worker by certificate: %v", err)
	}
	if tok := w.Subscribe("lp/devices/+/status", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	lost := make(chan error, 1)
	a, err := connect("dev-a", "dev-a", &devA, nil, lost)
	if err != nil {
		t.Fatalf("device by certificate: %v", err)
	}
	if tok := a.Publish("lp/devices/dev-a/status", 1, false, "a-online"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	testutil.Eventually(t, 5*time.Second, "dev-a's status at the worker", func() bool { return atWorker.has("lp/devices/dev-a/status=a-online") })

	if err := credential.Revoke(ctx, st, "dev-a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(10 * refresh):
		t.Fatal("device with a certificate still connected after its credential was revoked")
	}
	if _, err := connect("dev-a/2", "", &devA, nil, nil); err == nil {
		t.Error("device with a certificate logged in after its credential was revoked")
	}
}
