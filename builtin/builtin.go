// Package builtin holds the task kinds usable without writing Go: exec runs
// a process, noop does nothing, sleep waits. The CLI worker registers them;
// a library user can register them on any consumer.Mux.
package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// Kinds are the built-in kinds' names.
var Kinds = []string{"exec", "noop", "sleep"}

// Register registers every built-in kind on m.
func Register(m *consumer.Mux) {
	m.RegisterFunc("exec", Exec)
	m.RegisterFunc("noop", func(context.Context, *consumer.Job) error { return nil })
	m.RegisterFunc("sleep", Sleep)
}

// ExecPayload is the exec kind's payload.
type ExecPayload struct {
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env,omitempty"`
	Dir  string            `json:"dir,omitempty"`
}

// SleepPayload is the sleep kind's payload.
type SleepPayload struct {
	Duration task.Duration `json:"duration"`
	// Fail makes the attempt fail after sleeping, for trials.
	Fail bool `json:"fail,omitempty"`
}

// Validate checks a payload for a built-in kind; other kinds are refused
// with an error naming the kind. Errors wrap task.ErrInvalid.
func Validate(kind string, payload json.RawMessage) error {
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	switch kind {
	case "noop":
		return nil
	case "sleep":
		var p SleepPayload
		if err := strictDecode(payload, &p); err != nil {
			return fmt.Errorf("%w: payload: sleep: %v", task.ErrInvalid, err)
		}
		if p.Duration < 0 {
			return fmt.Errorf("%w: payload: sleep: duration must not be negative", task.ErrInvalid)
		}
		return nil
	case "exec":
		_, err := execPayload(payload)
		return err
	}
	return fmt.Errorf("%w: kind: %q is not a built-in kind (exec, noop, sleep)", task.ErrInvalid, kind)
}

func strictDecode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func execPayload(b json.RawMessage) (ExecPayload, error) {
	var p ExecPayload
	if err := strictDecode(b, &p); err != nil {
		return p, fmt.Errorf("%w: payload: exec: %v", task.ErrInvalid, err)
	}
	if len(p.Argv) == 0 || p.Argv[0] == "" {
		return p, fmt.Errorf("%w: payload: exec: argv must name a program", task.ErrInvalid)
	}
	return p, nil
}

// Sleep waits for the payload's duration, or until the context ends.
func Sleep(ctx context.Context, job *consumer.Job) error {
	var p SleepPayload
	if len(job.Task.Payload) > 0 {
		if err := json.Unmarshal(job.Task.Payload, &p); err != nil {
			return fmt.Errorf("sleep payload: %w", err)
		}
	}
	t := time.NewTimer(time.Duration(p.Duration))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if p.Fail {
		return errors.New("sleep: failing as asked")
	}
	return nil
}

// Exec runs the payload's program. It gets LEASEPOOL_TASK_KEY,
// LEASEPOOL_ATTEMPT and LEASEPOOL_WORKER_ID; exit status 0 is success. On
// lease loss, cancel or shutdown the whole process group is killed.
func Exec(ctx context.Context, job *consumer.Job) error {
	p, err := execPayload(job.Task.Payload)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, p.Argv[0], p.Argv[1:]...)
	cmd.Dir = p.Dir
	cmd.Env = os.Environ()
	for k, v := range p.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env,
		"LEASEPOOL_TASK_KEY="+job.Task.Key,
		"LEASEPOOL_ATTEMPT="+strconv.Itoa(job.Attempt),
		"LEASEPOOL_WORKER_ID="+job.WorkerID,
	)
	cmd.SysProcAttr = procAttr()
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr tailBuffer
	cmd.Stdout = os.Stdout
	cmd.Stderr = &stderr
	err = cmd.Run()
	if ctx.Err() != nil {
		return fmt.Errorf("exec %s: killed: %w", p.Argv[0], context.Cause(ctx))
	}
	if err != nil {
		if s := bytes.TrimSpace(stderr.buf); len(s) > 0 {
			return fmt.Errorf("exec %s: %w: %s", p.Argv[0], err, s)
		}
		return fmt.Errorf("exec %s: %w", p.Argv[0], err)
	}
	return nil
}

// tailBuffer keeps the last 2 KiB written, for error messages.
type tailBuffer struct{ buf []byte }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > 2048 {
		b.buf = b.buf[len(b.buf)-2048:]
	}
	return len(p), nil
}
