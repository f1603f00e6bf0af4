// Package tests holds end-to-end tests: several leasepool processes sharing
// real stores, killed with SIGKILL mid-run.
//
// A test here calls t.Parallel only when it mostly waits and what it
// asserts survives a busy CPU (no lease or heartbeat tight enough for a
// slowed process to miss): those run side by side, GOMAXPROCS at once,
// after the rest have run one at a time.
package tests

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
)

// built holds one build of a package per test binary, by package path.
var built sync.Map // string -> *binary

type binary struct {
	once sync.Once
	path string
	err  error
}

// buildBinary builds the program at pkg (a path relative to tests/) with
// the race detector, once per test binary, and returns its path. A
// program tests/run built already, race-enabled and of this tree, is in
// $LEASEPOOL_TEST_PROGRAMS under its package's name: tests/run links them
// beside go vet, before the tests take turns, so that linking them does
// not lengthen this package's turn.
func buildBinary(t *testing.T, pkg string) string {
	t.Helper()
	v, _ := built.LoadOrStore(pkg, &binary{})
	b := v.(*binary)
	b.once.Do(func() {
		if dir := os.Getenv("LEASEPOOL_TEST_PROGRAMS"); dir != "" {
			path := filepath.Join(dir, filepath.Base(pkg))
			if _, err := os.Stat(path); err == nil {
				b.path = path
				return
			}
		}
		dir, err := os.MkdirTemp("", "leasepool-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		if out, err := exec.Command("go", "build", "-race", "-o", b.path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// leasepoolBin builds the CLI once per test binary.
func leasepoolBin(t *testing.T) string {
	t.Helper()
	return buildBinary(t, "../cmd/leasepool")
}

// workerProc is one `leasepool worker` process.
type workerProc struct {
	id  string
	cmd *exec.Cmd
}

// startWorker starts a race-enabled worker whose exec programs run under
// the CLI's plain build as their guard (the hidden --exec-guard): a
// race-enabled guard costs three times the CPU to start, and the chaos
// runs start hundreds (docs/performance.md, "Two lanes"). The guard's own
// code runs race-enabled in package builtin's tests and in the tests of
// this package that start their workers with startRaceGuardedWorker.
func startWorker(t *testing.T, store, id string, extra ...string) *workerProc {
	t.Helper()
	return startWorkerEnv(t, []string{"LEASEPOOL_EXEC_GUARD=" + plainLeasepoolBin(t)}, store, id, extra...)
}

// startRaceGuardedWorker is startWorker with the worker's own
// race-enabled binary as its exec guard, for the tests of the guard.
func startRaceGuardedWorker(t *testing.T, store, id string, extra ...string) *workerProc {
	t.Helper()
	return startWorkerEnv(t, raceGuardEnv(), store, id, extra...)
}

func startWorkerEnv(t *testing.T, env []string, store, id string, extra ...string) *workerProc {
	t.Helper()
	args := append([]string{"--store", store, "--log-level", "warn", "worker", "--id", id}, extra...)
	cmd := exec.Command(leasepoolBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &workerProc{id: id, cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("worker %s log:\n%s", id, tail(string(b), 4000))
		}
	})
	return w
}

// raceGuardEnv is the environment that spares a worker's exec guards the
// race runtime's second of sleep at exit (GORACE atexit_sleep_ms): a guard
// is this race-enabled binary, given only the programs' environment, so
// without GORACE passed on (--exec-env) every exec task would end a second
// after its program, and a lock hand-off between exec tasks wait for it.
func raceGuardEnv() []string {
	pass := "GORACE"
	if v := os.Getenv("LEASEPOOL_EXEC_ENV"); v != "" {
		pass = v + ",GORACE"
	}
	return []string{strings.TrimSpace("GORACE=atexit_sleep_ms=0 " + os.Getenv("GORACE")), "LEASEPOOL_EXEC_ENV=" + pass}
}

func (w *workerProc) kill(t *testing.T) time.Time {
	t.Helper()
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	w.cmd.Wait()
	return at
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// eventually is testutil.Eventually at 20ms rather than testutil.Pace:
// the conditions here mostly read the store the worker processes share,
// or start a CLI process, so each check takes from the processes under
// test more than a read of memory would.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, d, 20*time.Millisecond, what, cond)
}

// consistently is testutil.Consistently at eventually's pace, for the
// same reason.
func consistently(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.ConsistentlyEvery(t, d, 20*time.Millisecond, what, cond)
}

// logLine is one line the exec tasks append: key attempt worker event
// nanos, and the pid of the process writing it where the program logs it.
type logLine struct {
	key, worker, event string
	attempt, pid       int
	at                 time.Time
}

func readRunLog(t *testing.T, path string) []logLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 5 && len(fields) != 6 {
			t.Fatalf("malformed run log line %q", sc.Text())
		}
		attempt, err1 := strconv.Atoi(fields[1])
		ns, err2 := strconv.ParseInt(fields[4], 10, 64)
		pid, err3 := 0, error(nil)
		if len(fields) == 6 {
			pid, err3 = strconv.Atoi(fields[5])
		}
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("malformed run log line %q", sc.Text())
		}
		out = append(out, logLine{key: fields[0], attempt: attempt, worker: fields[2], event: fields[3], pid: pid, at: time.Unix(0, ns)})
	}
	return out
}

// execPayload is an exec task that logs its start and end around a sleep.
func execPayload(logPath string, sleep time.Duration) string {
	script := fmt.Sprintf(`echo "$LEASEPOOL_TASK_KEY $LEASEPOOL_ATTEMPT $LEASEPOOL_WORKER_ID start $(date +%%s%%N)" >> %[1]s; sleep %[2]f; echo "$LEASEPOOL_TASK_KEY $LEASEPOOL_ATTEMPT $LEASEPOOL_WORKER_ID end $(date +%%s%%N)" >> %[1]s`,
		logPath, sleep.Seconds())
	return fmt.Sprintf(`{"argv":["sh","-c",%q]}`, script)
}

// interval is one attempt's run as the log shows it.
type interval struct {
	worker     string
	attempt    int
	start, end time.Time
}

// checkOverlaps asserts that no task ever had more attempts running at once
// than it allows. Attempts with no end line ran until their worker was
// killed (killedAt), or, when stoppedAt has the task, until it was stopped
// because other workers had finished the task.
func checkOverlaps(t *testing.T, lines []logLine, allowed map[string]int, killedAt map[string]time.Time, stoppedAt map[string]time.Time) map[string][]interval {
	t.Helper()
	runs := map[string]map[int]*interval{}
	for _, l := range lines {
		if runs[l.key] == nil {
			runs[l.key] = map[int]*interval{}
		}
		iv := runs[l.key][l.attempt]
		if iv == nil {
			iv = &interval{worker: l.worker, attempt: l.attempt}
			runs[l.key][l.attempt] = iv
		}
		if iv.worker != l.worker {
			t.Errorf("task %s attempt %d logged by two workers %s and %s: attempt numbers must be unique", l.key, l.attempt, iv.worker, l.worker)
		}
		if l.event == "start" {
			iv.start = l.at
		} else {
			iv.end = l.at
		}
	}
	out := map[string][]interval{}
	for key, byAttempt := range runs {
		var ivs []interval
		for _, iv := range byAttempt {
			if iv.end.IsZero() {
				k, ok := killedAt[iv.worker]
				if stop, stopped := stoppedAt[key]; !ok && stopped {
					k, ok = stop, true
				}
				if !ok {
					t.Errorf("task %s attempt %d on live worker %s never ended", key, iv.attempt, iv.worker)
					continue
				}
				iv.end = k
			}
			ivs = append(ivs, *iv)
		}
		for _, a := range ivs {
			n := 0
			for _, b := range ivs {
				if !b.start.After(a.start) && b.end.After(a.start) {
					n++
				}
			}
			if n > allowed[key] {
				t.Errorf("task %s: %d attempts live at once at %s, allowed %d: %+v", key, n, a.start.Format(time.StampMicro), allowed[key], ivs)
			}
		}
		out[key] = ivs
	}
	return out
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startProc starts cmd with its output in a log of the test's, kills it
// at cleanup if it still runs, and shows the log's tail if t failed.
func startProc(t *testing.T, name string, cmd *exec.Cmd) *workerProc {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%s", name, tail(string(b), 3000))
		}
	})
	return &workerProc{id: name, cmd: cmd}
}

// startLogged starts cmd with its output kept, and kills it when t ends,
// logging the output's tail if t failed.
func startLogged(t *testing.T, name string, cmd *exec.Cmd) {
	t.Helper()
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, tail(out.String(), 4000))
		}
	})
}
