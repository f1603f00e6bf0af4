package builtin_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

func TestMain(m *testing.M) {
	builtin.GuardMain() // this test binary is the guard of guardedExec
	goleak.VerifyTestMain(m)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind, payload string
		ok            bool
		names         string // a word the error must contain
	}{
		{"noop", ``, true, ""},
		{"noop", `{"anything":[1]}`, true, ""},
		{"sleep", ``, true, ""},
		{"sleep", `{"duration":"1.5s"}`, true, ""},
		{"sleep", `{"duration":1000,"fail":true}`, true, ""},
		{"sleep", `{"duration":"-1s"}`, false, "duration"},
		{"sleep", `{"duration":"soon"}`, false, "sleep"},
		{"sleep", `{"durration":"1s"}`, false, "durration"},
		{"sleep", `[1]`, false, "sleep"},
		{"exec", `{"argv":["true"]}`, true, ""},
		{"exec", `{"argv":["sh","-c","exit 0"],"env":{"A":"b"},"dir":"/"}`, true, ""},
		{"exec", ``, false, "argv"},
		{"exec", `{"argv":[]}`, false, "argv"},
		{"exec", `{"argv":[""]}`, false, "argv"},
		{"exec", `{"argv":"true"}`, false, "exec"},
		{"exec", `{"argv":["true"],"cwd":"/"}`, false, "cwd"},
		{"exec", `{`, false, "exec"},
		{"bogus", `{}`, false, "bogus"},
		{"", `{}`, false, "kind"},
	}
	for _, tt := range tests {
		t.Run(tt.kind+" "+tt.payload, func(t *testing.T) {
			t.Parallel()
			err := builtin.Validate(tt.kind, json.RawMessage(tt.payload))
			if tt.ok {
				if err != nil {
					t.Errorf("Validate = %v", err)
				}
				return
			}
			if !errors.Is(err, task.ErrInvalid) {
				t.Fatalf("Validate = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.names) {
				t.Errorf("Validate = %q, want it to mention %q", err, tt.names)
			}
			if tt.kind != "bogus" && tt.kind != "" && !strings.Contains(err.Error(), "payload") {
				t.Errorf("Validate = %q, want it to name the payload", err)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	m := consumer.NewMux()
	builtin.Register(m)
	if err := builtin.RegisterExec(m, builtin.ExecConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, k := range builtin.Kinds {
		if !slices.Contains(m.Kinds(), k) {
			t.Errorf("kind %s not registered: %v", k, m.Kinds())
		}
	}
	job := &consumer.Job{Task: &task.Task{Key: "k", Kind: "noop"}, Attempt: 1, WorkerID: "w"}
	if err := m.Handle(t.Context(), job); err != nil {
		t.Errorf("noop = %v", err)
	}
}

func execJob(t *testing.T, p builtin.ExecPayload) *consumer.Job {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &consumer.Job{Task: &task.Task{Key: "tasks/42", Kind: "exec", Payload: b}, Attempt: 7, WorkerID: "worker-a"}
}

func TestExecEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "env.txt")
	job := execJob(t, builtin.ExecPayload{
		Argv: []string{"sh", "-c", `printf '%s|%s|%s|%s|%s' "$LEASEPOOL_TASK_KEY" "$LEASEPOOL_ATTEMPT" "$LEASEPOOL_WORKER_ID" "$EXTRA" "$(pwd)" > "$OUT"`},
		Env:  map[string]string{"OUT": out, "EXTRA": "x y"},
		Dir:  dir,
	})
	if err := builtin.Exec(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	wantDir, _ := filepath.EvalSymlinks(dir)
	got := strings.Split(string(b), "|")
	if len(got) != 5 || got[0] != "tasks/42" || got[1] != "7" || got[2] != "worker-a" || got[3] != "x y" {
		t.Errorf("env seen = %q", b)
	}
	if len(got) == 5 {
		if gd, _ := filepath.EvalSymlinks(got[4]); gd != wantDir {
			t.Errorf("dir = %s, want %s", got[4], dir)
		}
	}
}

func TestExecFailure(t *testing.T) {
	t.Parallel()
	job := execJob(t, builtin.ExecPayload{Argv: []string{"sh", "-c", "echo 'disk on fire' >&2; exit 3"}})
	err := builtin.Exec(t.Context(), job)
	if err == nil {
		t.Fatal("non-zero exit reported success")
	}
	if !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("error %q lacks stderr or status", err)
	}

	job = execJob(t, builtin.ExecPayload{Argv: []string{"/nonexistent/program"}})
	if err := builtin.Exec(t.Context(), job); err == nil {
		t.Error("missing program reported success")
	}

	job = &consumer.Job{Task: &task.Task{Key: "k", Kind: "exec", Payload: json.RawMessage(`{"argv":[]}`)}}
	if err := builtin.Exec(t.Context(), job); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("bad payload = %v, want ErrInvalid", err)
	}
}

func TestExecLongStderrKeepsTail(t *testing.T) {
	t.Parallel()
	job := execJob(t, builtin.ExecPayload{Argv: []string{"sh", "-c", `i=0; while [ $i -lt 500 ]; do echo "line $i" >&2; i=$((i+1)); done; echo LAST >&2; exit 1`}})
	err := builtin.Exec(t.Context(), job)
	if err == nil || !strings.Contains(err.Error(), "LAST") || strings.Contains(err.Error(), "line 0\n") {
		t.Errorf("error = %.200q...", err)
	}
	if len(err.Error()) > 2200 {
		t.Errorf("error is %d bytes, want the stderr tail only", len(err.Error()))
	}
}

// gone reports whether pid no longer runs (absent, or a zombie awaiting a
// reaper).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	job := execJob(t, builtin.ExecPayload{
		Argv: []string{"sh", "-c", `sleep 30 & echo $! > "$PIDFILE.tmp"; mv "$PIDFILE.tmp" "$PIDFILE"; wait`},
		Env:  map[string]string{"PIDFILE": pidFile},
	})
	cause := errors.New("lease lost in test")
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- builtin.Exec(ctx, job) }()

	pid := waitPid(t, pidFile)
	if gone(pid) {
		t.Fatal("child sleep not running before cancel")
	}
	start := time.Now()
	cancel(cause)
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Errorf("Exec = %v, want the cancel cause", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec did not return after cancel")
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Exec returned %s after cancel: it waited for the child rather than killing it", took)
	}
	waitGone(t, pid, 5*time.Second, "child sleep, after the cancel")
}

func sleepJob(t *testing.T, payload string) *consumer.Job {
	t.Helper()
	return &consumer.Job{Task: &task.Task{Key: "k", Kind: "sleep", Payload: json.RawMessage(payload)}, Attempt: 1, WorkerID: "w"}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	if err := builtin.Sleep(t.Context(), sleepJob(t, `{"duration":"1ms"}`)); err != nil {
		t.Errorf("Sleep = %v", err)
	}
	if err := builtin.Sleep(t.Context(), sleepJob(t, ``)); err != nil {
		t.Errorf("Sleep with no payload = %v", err)
	}
	if err := builtin.Sleep(t.Context(), sleepJob(t, `{"duration":"1ms","fail":true}`)); err == nil {
		t.Error("fail:true succeeded")
	}
	if err := builtin.Sleep(t.Context(), sleepJob(t, `{"duration":true}`)); err == nil {
		t.Error("bad payload succeeded")
	}

	cause := errors.New("shutdown in test")
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- builtin.Sleep(ctx, sleepJob(t, `{"duration":"1h"}`)) }()
	cancel(cause)
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Errorf("Sleep = %v, want the cancel cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Sleep ignored ctx")
	}
}
