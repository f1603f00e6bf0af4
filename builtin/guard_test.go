package builtin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
)

// guardedExec is the exec handler guarded by this test binary (TestMain
// calls GuardMain).
func guardedExec(t *testing.T, grace time.Duration) consumer.HandlerFunc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h, err := builtin.NewExec(builtin.ExecConfig{GuardPath: self, KillGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestNewExecValidates(t *testing.T) {
	t.Parallel()
	if _, err := builtin.NewExec(builtin.ExecConfig{KillGrace: -time.Second}); err == nil || !strings.Contains(err.Error(), "KillGrace") {
		t.Errorf("negative KillGrace: %v", err)
	}
	if _, err := builtin.NewExec(builtin.ExecConfig{GuardPath: "/nonexistent/guard"}); err == nil || !strings.Contains(err.Error(), "GuardPath") {
		t.Errorf("missing GuardPath: %v", err)
	}
}

func TestGuardedExecReportsLikeExec(t *testing.T) {
	t.Parallel()
	exec := guardedExec(t, time.Second)
	dir := t.TempDir()
	out := filepath.Join(dir, "env.txt")
	job := execJob(t, builtin.ExecPayload{
		Argv: []string{"sh", "-c", `printf '%s|%s|%s|%s' "$LEASEPOOL_TASK_KEY" "$LEASEPOOL_ATTEMPT" "$LEASEPOOL_WORKER_ID" "$EXTRA" > "$OUT"`},
		Env:  map[string]string{"OUT": out, "EXTRA": "x y"},
		Dir:  dir,
	})
	if err := exec(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "tasks/42|7|worker-a|x y" {
		t.Errorf("env seen = %q, %v", b, err)
	}

	job = execJob(t, builtin.ExecPayload{Argv: []string{"sh", "-c", "echo 'disk on fire' >&2; exit 3"}})
	if err := exec(t.Context(), job); err == nil || !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("failure = %v, want stderr and status", err)
	}
	job = execJob(t, builtin.ExecPayload{Argv: []string{"sh", "-c", "kill -9 $$"}})
	if err := exec(t.Context(), job); err == nil || !strings.Contains(err.Error(), "signal: killed") {
		t.Errorf("killed program = %v, want signal: killed", err)
	}
	job = execJob(t, builtin.ExecPayload{Argv: []string{"/nonexistent/program"}})
	if err := exec(t.Context(), job); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing program = %v", err)
	}
}

// waitPid reads a pid a program wrote to path.
func waitPid(t *testing.T, path string) int {
	t.Helper()
	var b []byte
	testutil.Eventually(t, 10*time.Second, path+" to be written", func() bool {
		// A file seen between its creation and its write is empty.
		var err error
		b, err = os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func waitGone(t *testing.T, pid int, within time.Duration, what string) {
	t.Helper()
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // if it outlived the wait
	testutil.Eventually(t, within, fmt.Sprintf("%s (pid %d) to be gone", what, pid), func() bool { return gone(pid) })
}

// A descendant that leaves the program's session and process group and is
// orphaned still dies on cancel: the guard is its subreaper.
func TestGuardedExecCancelKillsEscapedDescendant(t *testing.T) {
	t.Parallel()
	exec := guardedExec(t, time.Second)
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	job := execJob(t, builtin.ExecPayload{
		Argv: []string{"sh", "-c", `(setsid sh -c 'echo $$ > "$PIDFILE.tmp"; mv "$PIDFILE.tmp" "$PIDFILE"; exec sleep 30' &) ; sleep 30`},
		Env:  map[string]string{"PIDFILE": pidFile},
	})
	cause := errors.New("lease lost in test")
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- exec(ctx, job) }()
	pid := waitPid(t, pidFile)
	cancel(cause)
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Errorf("exec = %v, want the cancel cause", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec did not return after cancel")
	}
	waitGone(t, pid, 2*time.Second, "setsid grandchild")
}

// Background processes left when the program exits are killed with it.
func TestGuardedExecKillsLeftovers(t *testing.T) {
	t.Parallel()
	exec := guardedExec(t, time.Second)
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	job := execJob(t, builtin.ExecPayload{
		Argv: []string{"sh", "-c", `setsid sh -c 'echo $$ > "$PIDFILE.tmp"; mv "$PIDFILE.tmp" "$PIDFILE"; exec sleep 30' >/dev/null 2>&1 & while [ ! -e "$PIDFILE" ]; do sleep 0.01; done`},
		Env:  map[string]string{"PIDFILE": pidFile},
	})
	if err := exec(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	waitGone(t, waitPid(t, pidFile), 2*time.Second, "left-over background process")
}

// On shutdown a program gets SIGTERM; one that ignores it gets SIGKILL
// after the grace period.
func TestGuardedExecShutdownTermThenKill(t *testing.T) {
	t.Parallel()
	for _, guarded := range []bool{true, false} {
		t.Run(strconv.FormatBool(guarded), func(t *testing.T) {
			t.Parallel()
			const grace = 700 * time.Millisecond
			exec := builtin.Exec
			if guarded {
				exec = guardedExec(t, grace)
			}
			dir := t.TempDir()
			marker := filepath.Join(dir, "term")
			job := execJob(t, builtin.ExecPayload{
				Argv: []string{"bash", "-c", `trap 'echo got-term > "$MARK"; exit 0' TERM; echo $$ > "$MARK.pid"; while true; do sleep 0.05; done`},
				Env:  map[string]string{"MARK": marker},
			})
			ctx, cancel := context.WithCancelCause(t.Context())
			errc := make(chan error, 1)
			go func() { errc <- exec(ctx, job) }()
			waitPid(t, marker+".pid")
			cancel(consumer.ErrShutdown)
			if err := <-errc; !errors.Is(err, consumer.ErrShutdown) {
				t.Errorf("exec = %v, want ErrShutdown", err)
			}
			if b, err := os.ReadFile(marker); err != nil || strings.TrimSpace(string(b)) != "got-term" {
				t.Errorf("program did not see SIGTERM: %q, %v", b, err)
			}
			if guarded {
				// Exec's own (unguarded) fallback kills the group after the
				// grace but returns when the program exits; only the guarded
				// path is timed here.
				stubborn := execJob(t, builtin.ExecPayload{
					Argv: []string{"bash", "-c", `trap '' TERM; echo $$ > "$MARK.pid2"; while true; do sleep 0.05; done`},
					Env:  map[string]string{"MARK": marker},
				})
				ctx, cancel := context.WithCancelCause(t.Context())
				go func() { errc <- exec(ctx, stubborn) }()
				pid := waitPid(t, marker+".pid2")
				start := time.Now()
				cancel(consumer.ErrShutdown)
				err := <-errc
				took := time.Since(start)
				if !errors.Is(err, consumer.ErrShutdown) {
					t.Errorf("exec = %v, want ErrShutdown", err)
				}
				if took < grace || took > grace+3*time.Second {
					t.Errorf("a program ignoring SIGTERM was stopped %s after shutdown, want about the grace %s", took, grace)
				}
				waitGone(t, pid, time.Second, "program ignoring SIGTERM")
			}
		})
	}
}
