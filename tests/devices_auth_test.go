package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// forgeStatus connects once as user (none: anonymous) and publishes a
// retained online status with attributes to topic, as an impostor would;
// it reports whether the broker let it connect.
func forgeStatus(t *testing.T, url, user, password, topic string, attrs mqttdev.Labels) bool {
	t.Helper()
	clientID := "forger-" + randomSuffix(t)
	if user != "" {
		clientID = broker.ClientID(user, clientID) // the embedded broker's rule: refused for nothing else
	}
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	if user != "" {
		o.SetUsername(user).SetPassword(password)
	}
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return false
	}
	defer c.Disconnect(100)
	b, err := mqttdev.Encode(mqttdev.Status{Online: true, At: time.Now().UTC(), Attributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	// A broker that refuses the publish drops the connection (mochi) or
	// the message (Mosquitto): either way the wait ends.
	c.Publish(topic, 1, true, b).WaitTimeout(3 * time.Second)
	return true
}

// checkNoForgery checks that the store's inventory and device states hold
// none of the forged devices and that device real still has the ring it
// announced itself.
func checkNoForgery(t *testing.T, ctx context.Context, store task.Store, real, ring string, forged ...string) {
	t.Helper()
	invs, err := mqttdev.Inventories(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	states, err := mqttdev.StoreStates(store).DeviceStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range forged {
		if inv, ok := invs[id]; ok {
			t.Errorf("forged device %s reached the inventory: %+v", id, inv)
		}
		for _, s := range states {
			if s.ID == id {
				t.Errorf("forged device %s reached the device states: %+v", id, s)
			}
		}
	}
	if got := invs[real].Attributes["ring"]; got != ring {
		t.Errorf("device %s has ring %q in the inventory, want %q: a forged status got through", real, got, ring)
	}
}

// awaitAttr waits until device id's announced attribute k is v in the
// inventory.
func awaitAttr(t *testing.T, ctx context.Context, store task.Store, id, k, v string) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%s with %s=%s in the inventory", id, k, v), func() bool {
		invs, err := mqttdev.Inventories(ctx, store)
		return err == nil && invs[id].Attributes[k] == v
	})
}

// TestDeviceImpostorsRefusedByTheBroker: `leasepool device broker` checks
// the store's credentials. The impostor of issue 38 (`device simulate`
// with no credential, announcing ring=prod), a device with a wrong
// secret, an anonymous client and a device speaking for another get
// nothing into the inventory or the device states; the device that
// `device simulate --store` provisioned runs a command from a worker
// logged in with the store's worker secret; once revoked it is dropped
// and shown offline.
func TestDeviceImpostorsRefusedByTheBroker(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	bin := leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "ia" + randomSuffix(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	url := "tcp://" + addr
	brokerLog := startProcess(t, "broker", bin, "--store", storeURL, "device", "broker", "--listen", addr)
	eventually(t, 20*time.Second, "the broker to answer", func() bool { return mqttAccepting(addr) })
	deviceWorker(t, storeURL, "ia-w1", url, prefix)

	// The real device: its credential made in the store by the simulator.
	startProcess(t, "real", bin, "--store", storeURL, "device", "simulate", "--mqtt", url, "--prefix", prefix,
		"--count", "1", "--id-prefix", "real-", "--attr", "ring=canary", "--heartbeat", "1m", "--latency", "20ms")
	awaitAttr(t, ctx, store, "real-0", "ring", "canary")

	// The impostor of issue 38, and one with a wrong secret for real-0:
	// neither connects, and each exits saying the broker refused it (not
	// at its --start-timeout, which a refusal would otherwise wait for).
	creds := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(creds, []byte("real-0:not-its-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"device", "simulate", "--mqtt", url, "--prefix", prefix, "--count", "1", "--id-prefix", "0-fake-", "--attr", "ring=prod", "--duration", "3s", "--start-timeout", "3s"},
		{"device", "simulate", "--mqtt", url, "--prefix", prefix, "--count", "1", "--id-prefix", "real-", "--attr", "ring=prod", "--duration", "3s", "--start-timeout", "3s", "--credentials", creds},
	} {
		if out, stderr, code := runCLI(t, args...); code == 0 || !strings.Contains(stderr, "the broker refused the connection") {
			t.Errorf("leasepool %v: exit %d, want a refusal named:\n%s\n%s", args, code, tail(out, 1000), tail(stderr, 1000))
		}
	}
	topics := mqttdev.Topics{Prefix: prefix}
	if forgeStatus(t, url, "", "", topics.Device("0-fake-1", mqttdev.TopicStatus), mqttdev.Labels{"ring": "prod"}) {
		t.Error("an anonymous client connected")
	}
	other, err := credential.Add(ctx, store, "other", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, victim := range []string{"real-0", "0-fake-2"} {
		forgeStatus(t, url, "other", other, topics.Device(victim, mqttdev.TopicStatus), mqttdev.Labels{"ring": "prod"})
	}
	// The other device's own status comes after anything forged.
	if !forgeStatus(t, url, "other", other, topics.Device("other", mqttdev.TopicStatus), mqttdev.Labels{"ring": "lab"}) {
		t.Fatal("device other could not connect with its own credential")
	}
	awaitAttr(t, ctx, store, "other", "ring", "lab")
	checkNoForgery(t, ctx, store, "real-0", "canary", "0-fake-0", "0-fake-1", "0-fake-2")

	dc := &devCmd{key: "ia-cmd-1", device: "real-0", retries: 1}
	publishDevice(t, ctx, store, dc, shortCmd("blink"))
	eventually(t, 30*time.Second, "the command on real-0 to succeed", func() bool {
		tk, err := store.Get(ctx, dc.key)
		return err == nil && tk.State == task.StateSucceeded
	})

	if _, stderr, code := runCLI(t, "--store", storeURL, "device", "revoke", "real-0"); code != 0 {
		t.Fatalf("device revoke: exit %d: %s", code, stderr)
	}
	eventually(t, 20*time.Second, "real-0 offline in the store after its revocation", func() bool {
		ss, err := mqttdev.StoreStates(store).DeviceStates(ctx)
		for _, s := range ss {
			if s.ID == "real-0" {
				return err == nil && !s.Online
			}
		}
		return false
	})
	eventually(t, 10*time.Second, "the broker to log the revocation", func() bool {
		b, _ := os.ReadFile(brokerLog)
		return strings.Contains(string(b), "credential was revoked")
	})
}

// startProcess runs the leasepool binary with args until t ends and
// returns the path of its log (stdout and stderr).
func startProcess(t *testing.T, name, bin string, args ...string) string {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log (tail):\n%s", name, tail(string(b), 3000))
		}
	})
	return logPath
}

// TestDeviceCredentialsOnMosquitto: a Mosquitto of the test's own, set up
// as docs/devices.md says (password_file from the secrets `leasepool
// device add` printed, acl_file keeping each device to its own topics),
// refuses anonymous clients and wrong passwords and drops a device's
// publishes as another, while a worker with its own user runs a command
// on the device end to end.
func TestDeviceCredentialsOnMosquitto(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "mq" + randomSuffix(t)
	dir := t.TempDir()

	secrets := map[string]string{}
	for _, id := range []string{"m-0", "m-1"} {
		out, stderr, code := runCLI(t, "--store", storeURL, "device", "add", id)
		if code != 0 {
			t.Fatalf("device add %s: exit %d: %s", id, code, stderr)
		}
		secrets[id] = strings.TrimSpace(out)
	}
	workerPassword := randomSuffix(t) + randomSuffix(t) + randomSuffix(t)
	passwd := filepath.Join(dir, "passwd")
	for i, up := range [][2]string{{"leasepool-worker", workerPassword}, {"m-0", secrets["m-0"]}, {"m-1", secrets["m-1"]}} {
		args := []string{"-b", passwd, up[0], up[1]}
		if i == 0 {
			args = append([]string{"-c"}, args...)
		}
		if out, err := exec.Command("mosquitto_passwd", args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd %s: %v: %s", up[0], err, out)
		}
	}
	acl := filepath.Join(dir, "acl")
	aclText := strings.ReplaceAll(mosquittoACL, "leasepool/", prefix+"/")
	if err := os.WriteFile(acl, []byte(aclText), 0o644); err != nil {
		t.Fatal(err)
	}
	url, _, _ := testservers.StartMosquittoAuth(t, fmt.Sprintf("allow_anonymous false\npassword_file %s\nacl_file %s\n", passwd, acl))

	startDeviceWorker(t, storeURL, "mq-w1", prefix, "--mqtt", url, "--mqtt-user", "leasepool-worker", "--mqtt-password", workerPassword)
	startSim(t, ctx, device.Config{BrokerURL: url, Prefix: prefix, IDPrefix: "m-", Count: 1, Heartbeat: time.Minute,
		Latency: 20 * time.Millisecond, Secrets: map[string]string{"m-0": secrets["m-0"]},
		Attributes: func(int, string) mqttdev.Labels { return mqttdev.Labels{"ring": "canary"} }})
	awaitAttr(t, ctx, store, "m-0", "ring", "canary")

	topics := mqttdev.Topics{Prefix: prefix}
	if forgeStatus(t, url, "", "", topics.Device("0-fake-0", mqttdev.TopicStatus), mqttdev.Labels{"ring": "prod"}) {
		t.Error("an anonymous client connected")
	}
	if forgeStatus(t, url, "m-0", "not-its-secret", topics.Device("m-0", mqttdev.TopicStatus), mqttdev.Labels{"ring": "prod"}) {
		t.Error("an impostor with a wrong password connected")
	}
	for _, victim := range []string{"m-0", "0-fake-1"} {
		forgeStatus(t, url, "m-1", secrets["m-1"], topics.Device(victim, mqttdev.TopicStatus), mqttdev.Labels{"ring": "prod"})
	}
	if !forgeStatus(t, url, "m-1", secrets["m-1"], topics.Device("m-1", mqttdev.TopicStatus), mqttdev.Labels{"ring": "lab"}) {
		t.Fatal("device m-1 could not connect with its own credential")
	}
	awaitAttr(t, ctx, store, "m-1", "ring", "lab")
	checkNoForgery(t, ctx, store, "m-0", "canary", "0-fake-0", "0-fake-1")

	dc := &devCmd{key: "mq-cmd-1", device: "m-0", retries: 1}
	publishDevice(t, ctx, store, dc, shortCmd("blink"))
	eventually(t, 30*time.Second, "the command on m-0 to succeed", func() bool {
		tk, err := store.Get(ctx, dc.key)
		return err == nil && tk.State == task.StateSucceeded
	})
}

// mosquittoACL is the acl_file of docs/devices.md, for prefix leasepool.
const mosquittoACL = `# The workers: commands out, replies in.
user leasepool-worker
topic write leasepool/devices/+/cmd
topic read leasepool/devices/+/status
topic read leasepool/devices/+/ack
topic read leasepool/devices/+/result

# Every device (user name = device id): its own topics only.
pattern write leasepool/devices/%u/status
pattern write leasepool/devices/%u/ack
pattern write leasepool/devices/%u/result
pattern read leasepool/devices/%u/cmd
`

// TestDeviceClientCertificates: `device broker --tls-cert --tls-key
// --client-ca` lets in a worker process by its certificate (common name
// worker:<id>, given with --mqtt-cert) and a device by its own (its id,
// with a credential in the store), and the device's status reaches the
// inventory; a device certificate of another CA is refused.
func TestDeviceClientCertificates(t *testing.T) {
	ctx := testContext(t, time.Minute)
	bin := leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "tl" + randomSuffix(t)
	dir := t.TempDir()
	ca, other := testutil.NewCA(t), testutil.NewCA(t)
	caFile := ca.WriteCA(t, dir, "ca")
	serverCert, serverKey := ca.WritePair(t, dir, "broker", true)
	workerCert, workerKey := ca.WritePair(t, dir, credential.WorkerUser("tls-w1"), false)
	if _, err := credential.Add(ctx, store, "tls-dev", false); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	url := "ssl://" + addr
	startProcess(t, "broker", bin, "--store", storeURL, "device", "broker", "--listen", addr,
		"--tls-cert", serverCert, "--tls-key", serverKey, "--client-ca", caFile)
	startDeviceWorker(t, storeURL, "tls-w1", prefix, "--mqtt", url, "--mqtt-ca", caFile, "--mqtt-cert", workerCert, "--mqtt-key", workerKey)

	status := func(signer testutil.CA, cn string) error {
		cert, err := tls.LoadX509KeyPair(signer.WritePair(t, dir, cn, false))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		o := paho.NewClientOptions().AddBroker(url).SetClientID(broker.ClientID(cn, "tls-"+randomSuffix(t))).
			SetTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{cert}}).
			SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
		c := paho.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			return fmt.Errorf("connect: %v", tok.Error())
		}
		defer c.Disconnect(100)
		b, _ := mqttdev.Encode(mqttdev.Status{Online: true, At: time.Now().UTC(), Attributes: mqttdev.Labels{"ring": "tls"}})
		tok := c.Publish(mqttdev.Topics{Prefix: prefix}.Device(cn, mqttdev.TopicStatus), 1, true, b)
		tok.WaitTimeout(5 * time.Second)
		return tok.Error()
	}
	if err := status(other, "tls-dev"); err == nil {
		t.Error("a device certificate of another CA was let in")
	}
	eventually(t, 20*time.Second, "the broker to let the device in by its certificate", func() bool { return status(ca, "tls-dev") == nil })
	awaitAttr(t, ctx, store, "tls-dev", "ring", "tls")
}
