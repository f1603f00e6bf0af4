package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// registered returns the live registry record of id, if any.
func registered(t *testing.T, s task.Store, id string) (task.WorkerInfo, bool) {
	t.Helper()
	ws, err := s.Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID == id && w.Live(s.Now()) {
			return w, true
		}
	}
	return task.WorkerInfo{}, false
}

// TestDuplicateWorkerIDProcesses: two `leasepool worker --id dup` processes
// never run at once. The second refuses to start with one line naming the
// id and the holder's host and pid; it may start once the holder is gone
// (SIGKILL: at once, its pid is dead) or its registration lapsed (SIGSTOP:
// after the heartbeat timeout), and the frozen holder, resumed, does not
// take the id back.
func TestDuplicateWorkerIDProcesses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "store.db")
	store, err := sqlitestore.Open(context.Background(), dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	url := "sqlite:" + dbPath
	host, _ := os.Hostname()

	a := startWorker(t, url, "dup")
	eventually(t, 20*time.Second, "worker A to register", func() bool {
		w, ok := registered(t, store, "dup")
		return ok && w.PID == a.cmd.Process.Pid
	})

	_, stderr, code := runCLI(t, "--store", url, "--log-level", "warn", "worker", "--id", "dup")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code == 0 || len(lines) != 1 {
		t.Fatalf("second worker under a live id: exit %d, stderr %q; want a non-zero exit and one line", code, stderr)
	}
	for _, want := range []string{`"dup"`, host, fmt.Sprintf("pid %d", a.cmd.Process.Pid)} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("refusal %q does not name %s", lines[0], want)
		}
	}

	out, stderr, code := runCLI(t, "--store", url, "workers", "--json")
	var listed []task.WorkerInfo
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 1 || listed[0].PID != a.cmd.Process.Pid ||
		listed[0].Host != host || listed[0].Concurrency != 8 || len(listed[0].Kinds) == 0 {
		t.Fatalf("workers --json: exit %d, %s %s", code, out, stderr)
	}
	if out, _, code := runCLI(t, "--store", url, "workers"); code != 0 || !strings.Contains(out, "dup") || !strings.Contains(out, "live") {
		t.Fatalf("workers: exit %d, %q", code, out)
	}

	// A frozen holder keeps the id until its registration lapses.
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	var b *workerProc
	eventually(t, 30*time.Second, "a worker under the frozen holder's id to start", func() bool {
		b = startWorker(t, url, "dup")
		exited := false
		testutil.Within(30*time.Second, func() bool {
			if w, ok := registered(t, store, "dup"); ok && w.PID == b.cmd.Process.Pid {
				return true
			}
			exited = b.cmd.ProcessState != nil || processExited(b)
			return exited // refused the id: start another
		})
		return !exited
	})
	waited := time.Since(frozenAt)
	t.Logf("a new process took the frozen holder's id after %s", waited.Round(time.Millisecond))
	if waited < 2*time.Second {
		t.Errorf("the id was taken %s after the holder froze, before its registration (4s heartbeat timeout) could lapse", waited)
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Resumed, A must not take the id back: B's registration stays.
	consistently(t, 3*time.Second, fmt.Sprintf("B (pid %d) registered under the id after the frozen holder resumed", b.cmd.Process.Pid), func() bool {
		w, ok := registered(t, store, "dup")
		return ok && w.PID == b.cmd.Process.Pid
	})

	// A killed holder's id is taken over at once on its host.
	a.kill(t)
	b.kill(t)
	killedAt := time.Now()
	c := startWorker(t, url, "dup")
	eventually(t, 20*time.Second, "a restart under the killed worker's id", func() bool {
		w, ok := registered(t, store, "dup")
		return ok && w.PID == c.cmd.Process.Pid
	})
	t.Logf("restart under a SIGKILLed worker's id registered after %s", time.Since(killedAt).Round(time.Millisecond))
}

// processExited reports whether w's process has exited, reaping it.
func processExited(w *workerProc) bool {
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(w.cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
	return err != nil || pid == w.cmd.Process.Pid
}

// TestFailedExecBacksOff: a program that cannot start no longer burns its
// retries in a millisecond: each retry waits for the worker's backoff,
// doubling.
func TestFailedExecBacksOff(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "store.db")
	store, err := sqlitestore.Open(context.Background(), dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	url := "sqlite:" + dbPath
	if _, stderr, code := runCLI(t, "--store", url, "publish", "missing", "--kind", "exec",
		"--payload", `{"argv":["/nonexistent/program"]}`, "--retries", "2"); code != 0 {
		t.Fatalf("publish: exit %d: %s", code, stderr)
	}
	startWorker(t, url, "w", "--kinds", "exec", "--backoff", "400ms")
	var doc *task.Task
	eventually(t, 30*time.Second, "the task to fail", func() bool {
		doc, err = store.Get(context.Background(), "missing")
		return err == nil && doc.State == task.StateFailed
	})
	if len(doc.Attempts) != 3 {
		t.Fatalf("workers %+v; want 3 failed attempts", doc.Attempts)
	}
	for i, minGap := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond} {
		gap := doc.Attempts[i+1].StartedAt.Sub(doc.Attempts[i].EndedAt)
		t.Logf("retry %d started %s after attempt %d failed", i+1, gap.Round(time.Millisecond), i+1)
		if gap < minGap {
			t.Errorf("retry %d started %s after the failure, want at least %s (backoff 400ms doubling, -25%% jitter)", i+1, gap, minGap)
		}
	}
}
