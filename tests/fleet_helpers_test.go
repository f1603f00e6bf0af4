package tests

// The real-process fleet: a Mosquitto of the test's own, `leasepool
// worker` and `leasepool device simulate` processes built without the
// race detector (what they measure is throughput), and the store's
// writes counted from its change stream.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// fleetEnv runs the fleet tests: each takes minutes and most of the
// machine.
const fleetEnv = "LEASEPOOL_TEST_FLEET"

func needFleet(t *testing.T) {
	t.Helper()
	if os.Getenv(fleetEnv) == "" {
		t.Skipf("a fleet test takes minutes and the whole machine: set %s=1 to run it", fleetEnv)
	}
}

var plainBuild struct {
	once sync.Once
	path string
	err  error
}

// plainLeasepoolBin builds the CLI without the race detector, once per
// test binary (tests/run builds it beforehand: LEASEPOOL_TEST_PLAIN_BIN):
// the processes of the fleet, flow and fairness runs are measured, and a
// race build runs several times slower.
func plainLeasepoolBin(t testing.TB) string {
	t.Helper()
	plainBuild.once.Do(func() {
		if bin := os.Getenv("LEASEPOOL_TEST_PLAIN_BIN"); bin != "" {
			plainBuild.path = bin
			return
		}
		dir, err := os.MkdirTemp("", "leasepool-plain-")
		if err != nil {
			plainBuild.err = err
			return
		}
		plainBuild.path = filepath.Join(dir, "leasepool")
		if out, err := exec.Command("go", "build", "-o", plainBuild.path, "../cmd/leasepool").CombinedOutput(); err != nil {
			plainBuild.err = fmt.Errorf("go build ../cmd/leasepool: %v\n%s", err, out)
		}
	})
	if plainBuild.err != nil {
		t.Fatal(plainBuild.err)
	}
	return plainBuild.path
}

// fleetMosquitto starts a Mosquitto of this test's own on a free loopback
// port, with no connection limit and its open files limit raised to the
// hard limit, which must leave room for conns connections; the shared
// one of tests/servers serves every other test on the machine. It is
// stopped when t ends.
func fleetMosquitto(t *testing.T, conns int) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr != nil {
			t.Fatalf("mosquitto not found (tests/servers up installs it): %v", err)
		}
		bin = "/usr/sbin/mosquitto"
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < uint64(conns+256) {
		t.Fatalf("open files hard limit %d: Mosquitto needs about %d for %d connections (ulimit -Hn)", lim.Max, conns+256, conns)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listener %d 127.0.0.1\nallow_anonymous true\nmax_connections -1\nmax_queued_messages 10000\nlog_dest stdout\nlog_type error\nlog_type warning\nuser %s\n",
		port, currentUser()), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "mosquitto.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", fmt.Sprintf("ulimit -n %d && exec %s -c %s", lim.Max, bin, conf))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("mosquitto log (tail):\n%s", tail(string(b), 2000))
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	eventually(t, 10*time.Second, "mosquitto to listen on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "tcp://" + addr
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	out, _ := exec.Command("id", "-un").Output()
	return strings.TrimSpace(string(out))
}

// fleetWorker starts a `leasepool worker` process (plain build) running
// device tasks only, concurrency at once, with broker flags brokerArgs
// (--mqtt URL, or --embedded-broker ADDR); it is killed when t ends, its
// log shown if t failed.
func fleetWorker(t *testing.T, storeURL, id, prefix string, concurrency int, brokerArgs ...string) (*workerProc, string) {
	t.Helper()
	cmd := exec.Command(plainLeasepoolBin(t), append([]string{"--store", storeURL, "--log-level", "info", "worker", "--id", id,
		"--kinds", "device", "--concurrency", strconv.Itoa(concurrency), "--prefix", prefix, "--shutdown-timeout", "2s"}, brokerArgs...)...)
	logPath := filepath.Join(t.TempDir(), id+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker %s: %v", id, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		logf.Close()
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "panic:") {
			t.Errorf("worker %s log has a panic", id)
		}
		if t.Failed() {
			t.Logf("worker %s log (tail):\n%s", id, tail(string(b), 3000))
		}
	})
	return &workerProc{id: id, cmd: cmd}, logPath
}

// simProc is a `leasepool device simulate --json` process: its progress
// lines on stderr, its report on stdout when it stops.
type simProc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	// up is when the "connected:" progress line was read: every device
	// was up then.
	up    time.Time
	lines chan string
	done  chan struct{}
	logMu sync.Mutex
	log   []string
}

// startSimProc starts a simulator process with args (after `device
// simulate --json`) and waits until every one of its devices is up.
func startSimProc(t *testing.T, ctx context.Context, args ...string) *simProc {
	t.Helper()
	p := &simProc{lines: make(chan string, 64), done: make(chan struct{})}
	p.cmd = exec.Command(plainLeasepoolBin(t), append([]string{"--log-level", "error", "device", "simulate", "--json"}, args...)...)
	p.cmd.Stdout = &p.stdout
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.logMu.Lock()
			if len(p.log) < 200 {
				p.log = append(p.log, line)
			}
			p.logMu.Unlock()
			select {
			case p.lines <- line:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			p.logMu.Lock()
			t.Logf("simulator %v:\n%s", args, strings.Join(p.log, "\n"))
			p.logMu.Unlock()
		}
	})
	for {
		select {
		case line := <-p.lines:
			if strings.HasPrefix(line, "connected:") {
				p.up = time.Now()
				t.Logf("simulator %s", line)
				return p
			}
		case <-p.done:
			_ = p.cmd.Wait()
			t.Fatalf("simulator %v exited before its devices were up: %s", args, p.cmd.ProcessState)
		case <-ctx.Done():
			t.Fatalf("simulator %v: devices not up: %v", args, ctx.Err())
		}
	}
}

// stop interrupts the simulator and returns its report.
func (p *simProc) stop(t *testing.T) *device.Report {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("simulator: %v", err)
	}
	var r device.Report
	if err := json.Unmarshal(p.stdout.Bytes(), &r); err != nil {
		t.Fatalf("simulator report: %v", err)
	}
	return &r
}

// awaitStates waits until the workers recorded online devices online and
// offline devices offline, among the devices of ids.
func awaitStates(t *testing.T, ctx context.Context, store task.Store, d time.Duration, what string, want func(id string, online bool) bool, n int) {
	t.Helper()
	states := mqttdev.StoreStates(store)
	start, last := time.Now(), -1
	testutil.EventuallyEvery(t, d, time.Second, what, func() bool {
		ss, err := states.DeviceStates(ctx)
		if err != nil {
			return false
		}
		got := 0
		for _, s := range ss {
			if want(s.ID, s.Online) {
				got++
			}
		}
		if got != last && time.Since(start) > 5*time.Second {
			t.Logf("%s: %d of %d (%s)", what, got, n, time.Since(start).Round(time.Second))
		}
		last = got
		return got == n
	})
}

// writeCounter counts the store's writes from its change stream: every
// task write and every document write of the namespaces named, each
// attributed by counterOf.
type writeCounter struct {
	mu     sync.Mutex
	counts map[string]int
	on     bool
}

// watchWrites counts the store's writes while on, by the class whose
// returns for each write's task key, or document namespace and id.
func watchWrites(t *testing.T, ctx context.Context, store task.Store, class func(key, namespace, id string) string) *writeCounter {
	t.Helper()
	w := &writeCounter{counts: map[string]int{}}
	ns := []string{mqttdev.StateNamespace, mqttdev.InventoryNamespace, "leasepool.device-credential", "leasepool.rollout",
		"leasepool.control", "leasepool.pause", "leasepool.limit", "leasepool.stats.minute", "leasepool.stats.quarter", "leasepool.schedule"}
	cs, err := store.Watch(ctx, task.WatchParams{Documents: ns})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer cs.Close()
		for {
			ev, err := cs.Next(ctx)
			if err != nil {
				return
			}
			var c string
			switch {
			case ev.Document != nil:
				c = class("", ev.Document.Namespace, ev.Document.ID)
			default:
				c = class(ev.Key, "", "")
			}
			w.mu.Lock()
			if w.on {
				w.counts[c]++
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *writeCounter) set(on bool) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.on = on
	out := w.counts
	if on {
		w.counts = map[string]int{}
	}
	return out
}

// freeLoopbackAddr returns a loopback address nobody listens on now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// awaitListening waits until something accepts connections on addr.
func awaitListening(t *testing.T, d time.Duration, addr string) {
	t.Helper()
	eventually(t, d, "a listener on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}
