package broker_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/credential"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{cert, key}
}

// issue makes a certificate for cn signed by ca: a server's for
// 127.0.0.1, or a client's.
func (ca testCA) issue(t *testing.T, cn string, server bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (ca testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

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
	ca, other := newCA(t), newCA(t)
	const refresh = 200 * time.Millisecond
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(st), Refresh: refresh,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.issue(t, "broker", true)},
			ClientCAs: ca.pool(), ClientAuth: tls.RequireAndVerifyClientCert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := credential.Add(ctx, st, "dev-a", false); err != nil {
		t.Fatal(err)
	}

	connect := func(clientID, user string, cert *tls.Certificate, r *received, lost chan<- error) (paho.Client, error) {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.pool()}
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
	devA, devZ, worker, foreign := ca.issue(t, "dev-a", false), ca.issue(t, "dev-z", false), ca.issue(t, credential.WorkerUser("w1"), false), other.issue(t, "dev-a", false)
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
