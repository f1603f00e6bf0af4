package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// randomSuffix returns a short random hex string, so that topic prefixes,
// device ids and MQTT client ids of one run never meet those of another
// run (or another package's tests) on a shared broker.
func randomSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// openTestStore creates a fresh SQLite store file in a temp dir and returns
// it with its --store URL. The store is closed when t ends.
func openTestStore(t *testing.T, ctx context.Context) (*sqlitestore.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.db")
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, "sqlite:" + path
}

// sharedBroker returns the URL of the shared Mosquitto (tests/servers up),
// failing t at once with a clear message when it is unset or unreachable.
func sharedBroker(t *testing.T) string {
	t.Helper()
	url := testservers.MQTTURL(t)
	host := strings.TrimPrefix(strings.TrimPrefix(url, "tcp://"), "mqtt://")
	c, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		t.Fatalf("shared MQTT broker %s (%s) is not reachable: run `tests/servers up` and export its lines: %v", url, testservers.EnvMQTTURL, err)
	}
	c.Close()
	return url
}

// startSim starts a simulated fleet; it is stopped when t ends.
func startSim(t *testing.T, ctx context.Context, cfg device.Config) *device.Simulator {
	t.Helper()
	if cfg.Logger == nil && os.Getenv("LEASEPOOL_TEST_DEVICE_LOGS") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	sim, err := device.NewSimulator(cfg)
	if err != nil {
		t.Fatalf("simulator: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := sim.Start(sctx); err != nil {
		t.Fatalf("simulator %s* on %s did not start: %v", cfg.IDPrefix, cfg.BrokerURL, err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = sim.Stop(c)
	})
	return sim
}

// provisioned returns cfg with a credential of its own, made in store, for
// each of its devices: the embedded broker checks them.
func provisioned(t *testing.T, ctx context.Context, store task.Store, cfg device.Config) device.Config {
	t.Helper()
	prefix := cfg.IDPrefix
	if prefix == "" {
		prefix = "dev-"
	}
	cfg.Secrets = map[string]string{}
	for i := range cfg.Count {
		id := prefix + strconv.Itoa(i)
		secret, err := credential.AddSimulated(ctx, store, id)
		if err != nil {
			t.Fatalf("credential of %s: %v", id, err)
		}
		cfg.Secrets[id] = secret
	}
	return cfg
}

// awaitOnline waits until the device states in store, as the workers
// record them, count n devices online.
func awaitOnline(t *testing.T, ctx context.Context, store task.Store, n int) {
	t.Helper()
	states := mqttdev.StoreStates(store)
	eventually(t, 30*time.Second, "the workers to see every device online", func() bool {
		ss, err := states.DeviceStates(ctx)
		online := 0
		for _, s := range ss {
			if s.Online {
				online++
			}
		}
		return err == nil && online == n
	})
}

// tlogWriter writes log lines to t.Log.
type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// deviceWorker starts a `leasepool worker` process that runs device tasks
// only, against broker url with topic prefix prefix.
func deviceWorker(t *testing.T, storeURL, id, url, prefix string) *workerProc {
	t.Helper()
	w, _ := startDeviceWorker(t, storeURL, id, prefix, "--mqtt", url)
	return w
}

// startDeviceWorker starts a `leasepool worker` process that runs device
// tasks only, with broker flags brokerArgs; it returns the process and the
// path of its log.
func startDeviceWorker(t *testing.T, storeURL, id, prefix string, brokerArgs ...string) (*workerProc, string) {
	t.Helper()
	args := []string{"--store", storeURL, "--log-level", deviceLogLevel, "worker", "--id", id,
		"--kinds", "device", "--concurrency", "4", "--prefix", prefix, "--shutdown-timeout", "2s"}
	args = append(args, brokerArgs...)
	cmd := exec.Command(leasepoolBin(t), args...)
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
		// Workers are built with -race: a race or panic in one is a
		// failure even when its peers covered for it.
		for _, bad := range []string{"WARNING: DATA RACE", "panic:"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("worker %s log has %q", id, bad)
			}
		}
		if t.Failed() || os.Getenv("LEASEPOOL_TEST_DEVICE_LOGS") != "" {
			keep := filepath.Join(os.TempDir(), "leasepool-device-logs", strings.ReplaceAll(t.Name(), "/", "_"), id+".log")
			if os.MkdirAll(filepath.Dir(keep), 0o755) == nil && os.WriteFile(keep, b, 0o644) == nil {
				t.Logf("worker %s log kept in %s", id, keep)
			}
			t.Logf("worker %s log (tail):\n%s", id, tail(string(b), 3000))
		}
	})
	return &workerProc{id: id, cmd: cmd}, logPath
}

// deviceLogLevel is the workers' log level: info shows every device status
// change and snooze, which the failure messages need.
var deviceLogLevel = func() string {
	if l := os.Getenv("LEASEPOOL_TEST_DEVICE_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}()

// devCmd is a device task as the tests publish it.
type devCmd struct {
	key, device string
	priority    int
	retries     int // MaxUnexpectedRetries as given (NoRetries, or >0)
	seq         int64
}

// publishDevice publishes one device command with short timeouts.
func publishDevice(t *testing.T, ctx context.Context, s task.Store, dc *devCmd, c mqttdev.Command) {
	t.Helper()
	c.Device = dc.device
	// The default lease (task.DefaultWorkerTimeout): the tests fail when a
	// live worker loses one, and a loaded machine stalled the store's
	// writes past a lease of 1 s.
	p, err := mqttdev.PublishParams(dc.key, c, task.Options{Priority: dc.priority, MaxUnexpectedRetries: dc.retries})
	if err != nil {
		t.Fatalf("publish params %s: %v", dc.key, err)
	}
	tk, res, err := task.Publish(ctx, s, p)
	if err != nil || res != task.Inserted {
		t.Fatalf("publish %s: %v %v", dc.key, res, err)
	}
	dc.seq = tk.Seq
}

// countStates returns how many tasks are in each state.
func countStates(t *testing.T, ctx context.Context, s task.Store) map[task.State]int {
	t.Helper()
	all, err := s.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	out := map[task.State]int{}
	for _, tk := range all {
		out[tk.State]++
	}
	return out
}

func finished(m map[task.State]int) int {
	return m[task.StateSucceeded] + m[task.StateFailed] + m[task.StateCancelled]
}

// tasksByKey lists every task in the store.
func tasksByKey(t *testing.T, ctx context.Context, s task.Store) map[string]*task.Task {
	t.Helper()
	all, err := s.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	out := map[string]*task.Task{}
	for _, tk := range all {
		out[tk.Key] = tk
	}
	return out
}

// heldBy reports whether a task is running with a live entry of worker id.
func heldBy(t *testing.T, ctx context.Context, s task.Store, id string) bool {
	t.Helper()
	all, err := s.List(ctx, task.ListQuery{State: task.StateRunning})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	now := s.Now()
	for _, tk := range all {
		for _, w := range tk.Attempts {
			if w.WorkerID == id && w.Live(now) {
				return true
			}
		}
	}
	return false
}

// failures counts a task's FAIL and EXPIRED entries.
func failures(tk *task.Task) int {
	n := 0
	for _, w := range tk.Attempts {
		if w.State == task.AttemptFail || w.State == task.AttemptExpired {
			n++
		}
	}
	return n
}

// checkDeviceRuns checks the simulator's view against the store's:
// no overlap on any device, no stale attempt run (per task, the attempts a
// device ran only grow, and each ran once), every run belongs to an attempt
// the store handed out, and every SUCCESS entry has a successful run of
// that very attempt on the task's device. It returns each task's runs in
// start order.
func checkDeviceRuns(t *testing.T, rep *device.Report, tasks map[string]*task.Task) map[string][]device.Run {
	t.Helper()
	for _, o := range rep.Overlaps {
		t.Errorf("OVERLAP on %s: %s#%d arrived while %s#%d ran or waited (%s)", o.Device, o.TaskKey, o.Attempt, o.RunningTask, o.RunningAttempt, o.At.Format(time.StampMicro))
	}
	runs := map[string][]device.Run{}
	for _, r := range rep.Runs {
		runs[r.TaskKey] = append(runs[r.TaskKey], r)
	}
	for _, o := range rep.Overlaps {
		for _, key := range []string{o.RunningTask, o.TaskKey} {
			if tk := tasks[key]; tk != nil {
				b, _ := json.Marshal(tk.Attempts)
				t.Logf("  %s: attempts %d, workers %s", key, tk.AttemptsStarted, b)
			}
			for _, r := range runs[key] {
				t.Logf("  %s: ran attempt %d corr %s %s..%s ok=%v", key, r.Attempt, r.CorrelationID, r.Start.Format(time.StampMicro), r.End.Format(time.StampMicro), r.OK)
			}
		}
	}
	for key, rs := range runs {
		slices.SortFunc(rs, func(a, b device.Run) int { return a.Start.Compare(b.Start) })
		tk := tasks[key]
		if tk == nil {
			t.Errorf("device ran %s, which is not in the store", key)
			continue
		}
		c, err := mqttdev.DecodePayload(tk.Payload)
		if err != nil {
			t.Errorf("task %s: payload: %v", key, err)
			continue
		}
		for i, r := range rs {
			if r.Device != c.Device {
				t.Errorf("task %s for device %s ran on %s", key, c.Device, r.Device)
			}
			if i > 0 && r.Attempt <= rs[i-1].Attempt {
				t.Errorf("task %s: stale or repeated run: attempt %d ran after attempt %d", key, r.Attempt, rs[i-1].Attempt)
			}
			if r.Attempt > tk.AttemptsStarted {
				t.Errorf("task %s: device ran attempt %d, but the store handed out only %d", key, r.Attempt, tk.AttemptsStarted)
			}
		}
	}
	for key, tk := range tasks {
		for _, w := range tk.Attempts {
			if w.State != task.AttemptSuccess {
				continue
			}
			found := false
			for _, r := range runs[key] {
				found = found || (r.Attempt == w.Attempt && r.OK)
			}
			if !found {
				t.Errorf("task %s: attempt %d recorded SUCCESS by %s but the device has no successful run of it (runs %+v)", key, w.Attempt, w.WorkerID, runs[key])
			}
		}
	}
	return runs
}

// runCLI runs the leasepool binary and returns its stdout, stderr and exit
// code (-1 if it did not exit normally).
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(leasepoolBin(t), args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		code = 0
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run leasepool %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}
