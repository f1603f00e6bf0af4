package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// execStore opens a fresh embedded store for a test and returns it with
// its URL.
func execStore(t *testing.T) (task.Store, string) {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "store.db")
	s, err := sqlitestore.Open(context.Background(), dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, "sqlite:" + dbPath
}

func publishExec(t *testing.T, url, key string, argv []string, extra ...string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"argv": argv})
	args := append([]string{"--store", url, "publish", key, "--kind", "exec", "--payload", string(b)}, extra...)
	if _, stderr, code := runCLI(t, args...); code != 0 {
		t.Fatalf("publish %s: exit %d: %s", key, code, stderr)
	}
}

// TestWorkerRunsExecOnlyWhenNamed: a worker started without --kinds runs
// the other built-in kinds but never an exec task, and does not list exec
// in the registry; one whose --kinds names exec runs it.
func TestWorkerRunsExecOnlyWhenNamed(t *testing.T) {
	t.Parallel()
	s, url := execStore(t)
	marker := filepath.Join(t.TempDir(), "pwned")
	publishExec(t, url, "shell", []string{"/bin/sh", "-c", "id > " + marker})
	if _, stderr, code := runCLI(t, "--store", url, "publish", "plain", "--kind", "noop"); code != 0 {
		t.Fatalf("publish: exit %d: %s", code, stderr)
	}
	w := startRaceGuardedWorker(t, url, "default", "--embedded-broker", freeAddr(t))
	eventually(t, 30*time.Second, "the noop task to succeed", func() bool {
		d, err := s.Get(context.Background(), "plain")
		return err == nil && d.State == task.StateSucceeded
	})
	// Time enough to have claimed the exec task too: the window is the point.
	consistently(t, time.Second, "no exec program run by a worker started without --kinds", func() bool {
		_, err := os.Stat(marker)
		return err != nil
	})
	if d, err := s.Get(context.Background(), "shell"); err != nil || d.State != task.StatePending || len(d.Attempts) != 0 {
		t.Fatalf("exec task = %+v, %v; want it pending and never claimed", d, err)
	}
	info, ok := registered(t, s, "default")
	if !ok {
		t.Fatal("the default worker is not registered")
	}
	for _, k := range info.Kinds {
		if k == "exec" {
			t.Errorf("the default worker registered kinds %v, exec among them", info.Kinds)
		}
	}
	w.kill(t)

	startRaceGuardedWorker(t, url, "named", "--kinds", "exec")
	eventually(t, 30*time.Second, "the exec task to run on a worker naming exec", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
}

// TestWorkerExecAllowRefuses: with --exec-allow, a program outside the
// list fails its attempts with an error naming it and the flag, and never
// starts; an allowed program runs.
func TestWorkerExecAllowRefuses(t *testing.T) {
	t.Parallel()
	s, url := execStore(t)
	dir := t.TempDir()
	touch, err := exec.LookPath("touch")
	if err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "pwned")
	publishExec(t, url, "shell", []string{"sh", "-c", "id > " + marker}, "--retries", "1")
	publishExec(t, url, "allowed", []string{"touch", filepath.Join(dir, "made")})
	startRaceGuardedWorker(t, url, "w", "--kinds", "exec", "--backoff", "10ms", "--exec-allow", touch+",/nonexistent/*")
	eventually(t, 30*time.Second, "the refused task to fail and the allowed one to succeed", func() bool {
		a, err1 := s.Get(context.Background(), "allowed")
		r, err2 := s.Get(context.Background(), "shell")
		return err1 == nil && err2 == nil && a.State == task.StateSucceeded && r.State == task.StateFailed
	})
	r, _ := s.Get(context.Background(), "shell")
	want := fmt.Sprintf(`exec: program %q is not allowed by --exec-allow`, sh)
	for _, w := range r.Attempts {
		if w.Error != want {
			t.Errorf("attempt %d error %q, want %q", w.Attempt, w.Error, want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the refused program ran: its marker exists")
	}
	if _, err := os.Stat(filepath.Join(dir, "made")); err != nil {
		t.Errorf("the allowed program did not run: %v", err)
	}

	// A bad pattern or name is refused before anything starts.
	for _, bad := range [][]string{{"--exec-allow", "bin/*"}, {"--exec-allow", "/usr/[bin"}, {"--exec-allow", "/bin/true,"}, {"--exec-env", "A=B"}} {
		fresh := "sqlite:" + filepath.Join(t.TempDir(), "fresh.db")
		_, stderr, code := runCLI(t, append([]string{"--store", fresh, "worker", "--kinds", "exec"}, bad...)...)
		if code != 2 || !strings.Contains(stderr, bad[0]) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("worker %v: exit %d, stderr %q; want exit 2 and one line naming the flag", bad, code, stderr)
		}
		if _, err := os.Stat(strings.TrimPrefix(fresh, "sqlite:")); err == nil {
			t.Errorf("worker %v made its store before refusing the flag", bad)
		}
	}
}

// workerEnvSecrets are credentials a worker's environment may hold.
var workerEnvSecrets = map[string]string{
	"LEASEPOOL_TOKEN":         "tok-3b9f0e",
	"LEASEPOOL_READ_TOKEN":    "rtok-91aa2c",
	"LEASEPOOL_BASIC_AUTH":    "admin:basic-5d2e7a",
	"LEASEPOOL_MQTT_PASSWORD": "mqttpw-6e8b3d",
	"AWS_SECRET_ACCESS_KEY":   "aws-secret-2f7c9e",
}

// startSecretWorker starts a worker with workerEnvSecrets and extra
// variables in its environment (and LEASEPOOL_STORE holding a password in
// a URL it does not use) and returns the process and the path of its log.
func startSecretWorker(t *testing.T, url, id string, env []string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(leasepoolBin(t), append([]string{"--store", url, "--log-level", "debug", "worker", "--id", id}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	for k, v := range workerEnvSecrets {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logPath := filepath.Join(t.TempDir(), id+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
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
			t.Logf("worker %s log:\n%s", id, tail(string(b), 4000))
		}
	})
	return cmd, logPath
}

// TestWorkerExecEnvironment: an exec program's environment holds none of
// the worker's secrets; --exec-env passes the one it names.
func TestWorkerExecEnvironment(t *testing.T) {
	t.Parallel()
	_, url := execStore(t)
	dir := t.TempDir()
	for _, tt := range []struct {
		id     string
		args   []string
		passed string
	}{
		{"minimal", nil, ""},
		{"passes", []string{"--exec-env", "AWS_SECRET_ACCESS_KEY"}, "AWS_SECRET_ACCESS_KEY"},
	} {
		out := filepath.Join(dir, tt.id+".env")
		publishExec(t, url, tt.id, []string{"/bin/sh", "-c", "env > " + out}, "--pin", tt.id)
		_, _ = startSecretWorker(t, url, tt.id, nil, append([]string{"--kinds", "exec"}, tt.args...)...)
		var env string
		eventually(t, 30*time.Second, "the exec program to write its environment", func() bool {
			b, err := os.ReadFile(out)
			env = string(b)
			return err == nil && strings.Contains(env, "LEASEPOOL_TASK_KEY="+tt.id)
		})
		for k, v := range workerEnvSecrets {
			if has := strings.Contains(env, v); has != (k == tt.passed) {
				t.Errorf("worker %s: the program's environment holds %s: %v, want %v", tt.id, k, has, k == tt.passed)
			}
		}
		if strings.Contains(env, "LEASEPOOL_STORE") {
			t.Errorf("worker %s: the program's environment holds LEASEPOOL_STORE", tt.id)
		}
	}
}

// TestMQTTPasswordNeverPrinted: the password of an MQTT URL shows in no
// worker log line (connected, or failing to connect) and not in the
// output of `device simulate`.
func TestMQTTPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	_, url := execStore(t)
	addr := freeAddr(t)
	// Anonymous: the test is about the URL's password, which no broker checks.
	broker := exec.Command(leasepoolBin(t), "device", "broker", "--listen", addr, "--mqtt-anonymous")
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Process.Kill(); _ = broker.Wait() })
	const pw = "Pw-9c1e?x@y/z#w"
	escaped := "Pw-9c1e%3Fx%40y%2Fz%23w"
	hostile := "tcp://user:" + escaped + "@" + addr
	down := "tcp://user:" + escaped + "@127.0.0.1:1"
	bad := "tcp://user:Pw-9c1e%zz@" + addr // a URL net/url refuses, quoting it whole
	_, upLog := startSecretWorker(t, url, "up", nil, "--kinds", "device", "--mqtt", hostile)
	downCmd, downLog := startSecretWorker(t, url, "down", []string{"LEASEPOOL_MQTT_URL=" + down}, "--kinds", "device")
	logs := []string{upLog, downLog}
	// Wait for the connected line, and a few failing connects.
	eventually(t, 30*time.Second, "the worker to connect", func() bool {
		b, _ := os.ReadFile(logs[0])
		return strings.Contains(string(b), "connected")
	})
	time.Sleep(2 * time.Second) // a few failing connects: the other is stopped while it tries
	// Stopped while it still tries to connect, the other reports the URL.
	if err := downCmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the unconnected worker to report its broker", func() bool {
		b, _ := os.ReadFile(downLog)
		return strings.Contains(string(b), "127.0.0.1:1")
	})
	var outputs []string
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		outputs = append(outputs, string(b))
	}
	if !strings.Contains(outputs[0], "user:xxxxx@"+addr) {
		t.Errorf("the connected line does not name the broker with its password hidden:\n%s", tail(outputs[0], 2000))
	}
	// A password on the command line is visible in ps: the worker says so.
	const warning = "--mqtt holds a secret that every user of this machine can read in ps; give it in LEASEPOOL_MQTT_URL instead"
	if !strings.Contains(outputs[0], warning) {
		t.Errorf("a worker given a password in --mqtt does not warn %q:\n%s", warning, tail(outputs[0], 2000))
	}
	if strings.Contains(outputs[1], warning) || !strings.Contains(outputs[1], "user:xxxxx@127.0.0.1:1") {
		t.Errorf("a worker given its MQTT URL in the environment: want no warning and the URL masked in its log:\n%s", tail(outputs[1], 2000))
	}
	_, stderr, code := runCLI(t, "--store", url, "worker", "--id", "bad", "--kinds", "device", "--mqtt", bad)
	if code == 0 {
		t.Error("a worker with a malformed --mqtt URL started")
	}
	outputs = append(outputs, stderr)
	out, stderr, _ := runCLI(t, "device", "simulate", "--mqtt", hostile, "--duration", "1s")
	if !strings.Contains(out, "user:xxxxx@"+addr) {
		t.Errorf("device simulate does not name the broker with its password hidden: %q", out)
	}
	outputs = append(outputs, out, stderr)
	_, stderr, _ = runCLI(t, "device", "simulate", "--mqtt", bad, "--duration", "1s")
	outputs = append(outputs, stderr)
	_, stderr, _ = runCLI(t, "--store", url, "devices", "--from-broker", "--mqtt", bad)
	outputs = append(outputs, stderr)
	for i, o := range outputs {
		for _, s := range []string{pw, escaped, "Pw-9c1e", workerEnvSecrets["LEASEPOOL_MQTT_PASSWORD"]} {
			if strings.Contains(o, s) {
				t.Errorf("output %d holds %q:\n%s", i, s, tail(o, 2000))
			}
		}
	}
}
