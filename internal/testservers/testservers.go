// Package testservers gives tests the servers that tests/servers starts:
// the MongoDB wire-protocol test server (mongo-java-server) and Mosquitto.
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
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Environment variables printed by tests/servers.
const (
	EnvMongoURI      = "LEASEPOOL_TEST_MONGO_URI"
	EnvMongoLib      = "LEASEPOOL_TEST_MONGO_LIB"
	EnvMongoLauncher = "LEASEPOOL_TEST_MONGO_LAUNCHER"
	EnvMQTTURL       = "LEASEPOOL_TEST_MQTT_URL"
)

// StartTimeout bounds how long a started server may take to accept
// connections. The JVM compiles the launcher first, which is slow on a
// loaded machine.
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

func need(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run tests via the README's test command, which starts the servers (tests/servers up, then export the lines it prints)", name)
	}
	return v
}

// launcher returns the path of tests/mongo/Launcher.java.
func launcher(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvMongoLauncher); p != "" {
		return p
	}
	_, file, _, ok := runtime.Caller(0)
	if ok {
		p := filepath.Join(filepath.Dir(file), "..", "..", "tests", "mongo", "Launcher.java")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("%s is not set and tests/mongo/Launcher.java was not found: run tests via the README's test command, which starts the servers", EnvMongoLauncher)
	return ""
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
	src := launcher(t)
	dir := t.TempDir()
	port := freePort(t)
	s := &mongoProc{t: t, lib: lib, src: src, dir: dir, port: port, h2: h2File}
	s.start()
	t.Cleanup(s.stop)
	uri = "mongodb://127.0.0.1:" + strconv.Itoa(port) + "/?directConnection=true"
	return uri, s.stop, func() {
		t.Helper()
		s.stop()
		s.start()
	}
}

type mongoProc struct {
	t        testing.TB
	lib, src string
	dir, h2  string
	port     int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *syncBuffer
}

func (s *mongoProc) start() {
	s.t.Helper()
	args := []string{"-cp", s.lib + "/*", s.src, "--port", strconv.Itoa(s.port)}
	if s.h2 != "" {
		args = append(args, "--h2", s.h2)
	}
	cmd := exec.Command("java", args...)
	cmd.Dir = s.dir
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start mongo-java-server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.log = cmd, done, log
	s.mu.Unlock()

	addr := "127.0.0.1:" + strconv.Itoa(s.port)
	deadline := time.Now().Add(StartTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			s.t.Fatalf("mongo-java-server on %s exited before listening (%s); its log:\n%s", addr, cmd.ProcessState, log.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			s.t.Fatalf("mongo-java-server not listening on %s after %s; its log:\n%s", addr, StartTimeout, log.String())
		}
	}
}

func (s *mongoProc) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		s.t.Logf("mongo-java-server ignored SIGTERM for 30s and was killed; its log:\n%s", s.log.String())
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

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
