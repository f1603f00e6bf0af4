// Package builtin holds the task kinds usable without writing Go: exec runs
// a process, noop does nothing, sleep waits. Register registers noop and
// sleep on any consumer.Mux; exec, which runs whatever program a publisher
// names, only on request: RegisterExec (with an ExecConfig.GuardPath for
// guarded programs, ExecConfig.Allow to restrict which programs may run).
// The CLI worker registers exec only when its --kinds names it.
//
// # What an exec program can reach
//
// A program runs as the worker's user, in the payload's dir, with the
// worker's MinimalEnv variables (PATH, HOME, locale...), those
// ExecConfig.PassEnv names, the payload's env and leasepool's task
// variables; none of the worker's other variables, so none of its
// credentials unless PassEnv names them. It can read and write whatever
// that user can, including the store file of an embedded store.
//
// # Exec processes and their lease
//
// An exec program must not run on once its worker's lease is over, since a
// peer may then run the task. With ExecConfig.GuardPath set (the leasepool
// CLI sets it to itself), each program runs under a guard process that is
// a child subreaper (Linux), so every process the program starts, even one
// that forks away into its own session, stays below the guard. The guard
// kills them all (SIGKILL) when the worker dies (its pipe closes), when the
// lease the worker last reported runs out by the guard's own clock (a
// frozen worker: SIGSTOP, a stalled process), on lease loss or cancel, and
// once the program exits; on graceful shutdown they get SIGTERM first and
// SIGKILL after ExecConfig.KillGrace.
//
// Limits that remain: the guard is one more process; if it is itself
// frozen or SIGKILLed, only the program's direct child dies with it
// (parent-death signal), not its descendants. A whole host or VM paused
// past the lease stops everything, the guard's clock included, and its
// programs resume after a peer has started. A process handed to something
// outside the guard's tree (systemd-run, a container runtime, at) is not a
// descendant and is not killed. Without a guard (Exec, or NewExec with no
// GuardPath), and on systems other than Linux, a program's descendants
// outlive a worker killed with SIGKILL, and nothing stops a frozen
// worker's programs.
package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// Kinds are the built-in kinds' names.
var Kinds = []string{"exec", "noop", "sleep"}

// DefaultKinds are the built-in kinds Register registers: every one but
// exec.
var DefaultKinds = []string{"noop", "sleep"}

// Register registers the built-in kinds that run no program of the
// publisher's choosing (DefaultKinds) on m. Exec is registered apart, by
// RegisterExec.
func Register(m *consumer.Mux) {
	m.RegisterFunc("noop", func(context.Context, *consumer.Job) error { return nil })
	m.RegisterFunc("sleep", Sleep)
}

// RegisterExec registers the exec kind on m, configured by cfg
// (ExecConfig{} is exec with no guard and no allow-list). Whoever can
// publish to a worker running exec can run any program as that worker
// unless cfg.Allow restricts them.
func RegisterExec(m *consumer.Mux, cfg ExecConfig) error {
	h, err := NewExec(cfg)
	if err != nil {
		return err
	}
	m.RegisterFunc("exec", h)
	return nil
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
	return fmt.Errorf("%w: kind: %q is not a built-in kind (%s)", task.ErrInvalid, kind, strings.Join(Kinds, ", "))
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

// Exec runs the payload's program with no guard process: it is
// NewExec(ExecConfig{}), today's fallback for binaries that cannot act as a
// guard. See NewExec for what a program is told and when it is stopped, and
// the package doc for what only a guard covers.
func Exec(ctx context.Context, job *consumer.Job) error {
	return defaultExec.handle(ctx, job)
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
