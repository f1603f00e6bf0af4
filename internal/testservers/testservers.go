// Package testservers gives tests the servers that tests/servers starts:
// the MongoDB wire-protocol test server (mongo-java-server) and Mosquitto,
// and the headless Chromium it installs for the dashboard's browser tests.
//
// Tests read the addresses from the environment that `tests/servers up`
// prints. When a variable is missing the test fails (it never skips), so a
// run without servers cannot pass by testing nothing:
//
//	eval "$(tests/servers up | sed 's/^/export /')"
//	go test -race ./...
//
// StartMongo starts an extra mongo-java-server process that a test owns,
// for example an H2-backed one it stops and restarts.
package testservers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
)

// Environment variables printed by tests/servers.
const (
	EnvMongoURI     = "LEASEPOOL_TEST_MONGO_URI"
	EnvMongoLib     = "LEASEPOOL_TEST_MONGO_LIB"
	EnvMongoClasses = "LEASEPOOL_TEST_MONGO_CLASSES"
	EnvMQTTURL      = "LEASEPOOL_TEST_MQTT_URL"
	EnvChromium     = "LEASEPOOL_TEST_CHROMIUM"
)

// StartTimeout bounds how long a started server may take to accept
// connections: a JVM starts slowly on a loaded machine.
var StartTimeout = 60 * time.Second

// MongoURI returns the URI of the shared MongoDB test server
// (mongodb://127.0.0.1:PORT/?directConnection=true), or fails t.
func MongoURI(t testing.TB) string {
	t.Helper()
	return need(t, EnvMongoURI)
}

// MQTTURL returns the URL of the shared MQTT broker (tcp://127.0.0.1:PORT),
// or fails t.
func MQTTURL(t testing.TB) string {
	t.Helper()
	return need(t, EnvMQTTURL)
}

// Chromium returns the path of the Chromium binary that tests/servers up
// installs (Debian's chromium), from LEASEPOOL_TEST_CHROMIUM or else PATH,
// or fails t.
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("%s is not set and chromium is not on PATH: run tests via the README's test command, which installs it (tests/servers up)", EnvChromium)
	return ""
}

func need(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run tests via the README's test command, which starts the servers (tests/servers up, then export the lines it prints)", name)
	}
	return v
}

// StartMongo starts a mongo-java-server process of t's own on a free
// loopback port: in memory when h2File is empty, else backed by that H2
// file. It returns its URI, stop (SIGTERM and wait, so H2 writes its file;
// calling it twice is fine) and restart (start again on the same port and
// file; stops first if running). The process is stopped when t ends. stop
// and restart must be called from t's goroutine.
func StartMongo(t testing.TB, h2File string) (uri string, stop func(), restart func()) {
	t.Helper()
	lib := need(t, EnvMongoLib)
	classes := need(t, EnvMongoClasses)
	dir := t.TempDir()
	port := freePort(t)
	p := startProc(t, "mongo-java-server", port, 30*time.Second, func() *exec.Cmd {
		// A test's server lives for seconds: the JIT's first tier alone
		// and one GC thread cost it less CPU than the optimising tiers
		// and parallel GC would win back (docs/performance.md).
		args := []string{"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", lib + "/*:" + classes, "Launcher", "--port", strconv.Itoa(port)}
		if h2File != "" {
			args = append(args, "--h2", h2File)
		}
		cmd := exec.Command("java", args...)
		cmd.Dir = dir
		return cmd
	})
	return "mongodb://127.0.0.1:" + strconv.Itoa(port) + "/?directConnection=true", p.stop, p.restart
}

// StartMosquitto starts a Mosquitto broker of t's own (the binary that
// tests/servers up installs) on a free loopback port, with persistence in a
// temporary directory so that queued QoS 1 messages survive restart. It
// returns its URL, stop and restart, as StartMongo does.
func StartMosquitto(t testing.TB) (url string, stop func(), restart func()) {
	t.Helper()
	return StartMosquittoAuth(t, "allow_anonymous true\n")
}

// StartMosquittoAuth is StartMosquitto with auth, the configuration lines
// that say who may connect and what they may do (allow_anonymous,
// password_file, acl_file...), in place of allow_anonymous true.
func StartMosquittoAuth(t testing.TB, auth string) (url string, stop func(), restart func()) {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr == nil {
			bin, err = "/usr/sbin/mosquitto", nil
		}
	}
	if err != nil {
		t.Fatalf("mosquitto is not installed (not on PATH nor /usr/sbin): run tests via the README's test command, which installs it: %v", err)
	}
	dir := t.TempDir()
	port := freePort(t)
	conf := fmt.Sprintf("listener %d 127.0.0.1\n%spersistence true\npersistence_location %s/\nautosave_interval 1\nlog_dest stdout\nlog_type error\nlog_type warning\nlog_type notice\n", port, auth, dir)
	if u, err := user.Current(); err == nil && u.Username != "" {
		// As root, mosquitto would otherwise switch to user mosquitto,
		// which cannot write the temporary directory.
		conf += "user " + u.Username + "\n"
	}
	confPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "mosquitto", port, 10*time.Second, func() *exec.Cmd { return exec.Command(bin, "-c", confPath) })
	return "tcp://127.0.0.1:" + strconv.Itoa(port), p.stop, p.restart
}

// proc is a server process a test owns: started, waited for until its port
// accepts connections, stopped with SIGTERM (and killed after grace), and
// stopped when the test ends.
type proc struct {
	t      testing.TB
	name   string
	port   int
	grace  time.Duration
	newCmd func() *exec.Cmd

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *testutil.SyncBuffer
}

func startProc(t testing.TB, name string, port int, grace time.Duration, newCmd func() *exec.Cmd) *proc {
	t.Helper()
	p := &proc{t: t, name: name, port: port, grace: grace, newCmd: newCmd}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *proc) restart() {
	p.t.Helper()
	p.stop()
	p.start()
}

func (p *proc) start() {
	p.t.Helper()
	cmd := p.newCmd()
	log := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done, p.log = cmd, done, log
	p.mu.Unlock()

	addr := "127.0.0.1:" + strconv.Itoa(p.port)
	deadline := time.Now().Add(StartTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			p.t.Fatalf("%s on %s exited before listening (%s); its log:\n%s", p.name, addr, cmd.ProcessState, log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			p.t.Fatalf("%s not listening on %s after %s; its log:\n%s", p.name, addr, StartTimeout, log.String())
		}
	}
}

// stop sends SIGTERM (so the server writes its files) and waits; calling
// it again is harmless.
func (p *proc) stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(p.grace):
		_ = cmd.Process.Kill()
		<-done
		p.t.Logf("%s ignored SIGTERM for %s and was killed; its log:\n%s", p.name, p.grace, p.log.String())
	}
}

// freePort returns a loopback port that nothing listened on a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
