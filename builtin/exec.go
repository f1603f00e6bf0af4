package builtin

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasepool/leasepool/consumer"
)

// DefaultKillGrace is ExecConfig.KillGrace's default.
const DefaultKillGrace = 5 * time.Second

// maxRenewEvery bounds how often the worker tells a guard its lease.
const maxRenewEvery = 250 * time.Millisecond

// ExecConfig configures the exec kind's handler.
type ExecConfig struct {
	// GuardPath is the binary that guards each exec program: it must call
	// GuardMain first thing in main (the leasepool CLI does; pass its
	// os.Executable()). It is started as `GuardPath __exec-guard ARGV...`.
	// Empty: no guard, the program is the worker's own child; then a
	// program's descendants outlive a worker killed with SIGKILL, and
	// nothing stops the program while the worker is frozen (SIGSTOP, a
	// paused VM) and its lease runs out.
	GuardPath string
	// KillGrace is how long a program has between SIGTERM and SIGKILL when
	// the worker shuts down gracefully (consumer.ErrShutdown). Lease loss
	// and cancel kill at once, since a peer may start. Default
	// DefaultKillGrace; it must not be negative.
	KillGrace time.Duration
}

func (c *ExecConfig) validate() error {
	if c.KillGrace < 0 {
		return fmt.Errorf("builtin.ExecConfig: KillGrace must not be negative, got %s", c.KillGrace)
	}
	if c.GuardPath != "" {
		if _, err := os.Stat(c.GuardPath); err != nil {
			return fmt.Errorf("builtin.ExecConfig: GuardPath: %w", err)
		}
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	return nil
}

// NewExec returns the exec kind's handler. It runs the payload's program
// with LEASEPOOL_TASK_KEY, LEASEPOOL_ATTEMPT, LEASEPOOL_WORKER_ID and,
// when the job holds a lease, LEASEPOOL_LEASE_DEADLINE (RFC 3339 wall time
// at which the lease held at start ends; a hint only, since the worker
// renews it). Exit status 0 is success; a failure carries the tail of the
// program's stderr. The program runs in its own process group. On lease
// loss or cancel the group is killed at once (SIGKILL); on graceful
// shutdown it gets SIGTERM, then SIGKILL after KillGrace.
//
// With a GuardPath, a guard process owns the program and every process it
// starts, and kills them all when the worker dies, when the lease it was
// last told of runs out (a frozen worker), when the worker asks, and when
// the program exits (leftover background processes).
func NewExec(cfg ExecConfig) (consumer.HandlerFunc, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &execHandler{cfg: cfg}
	return h.handle, nil
}

var defaultExec = &execHandler{cfg: ExecConfig{KillGrace: DefaultKillGrace}}

type execHandler struct{ cfg ExecConfig }

func (h *execHandler) handle(ctx context.Context, job *consumer.Job) error {
	p, err := execPayload(job.Task.Payload)
	if err != nil {
		return err
	}
	env := os.Environ()
	for k, v := range p.Env {
		env = append(env, k+"="+v)
	}
	env = append(env,
		"LEASEPOOL_TASK_KEY="+job.Task.Key,
		"LEASEPOOL_ATTEMPT="+strconv.Itoa(job.Attempt),
		"LEASEPOOL_WORKER_ID="+job.WorkerID,
	)
	if left := job.LeaseRemaining(); left > 0 {
		env = append(env, "LEASEPOOL_LEASE_DEADLINE="+time.Now().Add(left).Format(time.RFC3339Nano))
	}
	if h.cfg.GuardPath == "" {
		return h.direct(ctx, p, env)
	}
	return h.guarded(ctx, job, p, env)
}

func shuttingDown(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), consumer.ErrShutdown)
}

// direct runs the program as the worker's child.
func (h *execHandler) direct(ctx context.Context, p ExecPayload, env []string) error {
	cmd := exec.CommandContext(ctx, p.Argv[0], p.Argv[1:]...)
	cmd.Dir = p.Dir
	cmd.Env = env
	cmd.SysProcAttr = procAttr()
	grace := h.cfg.KillGrace
	cmd.Cancel = func() error {
		pgid := cmd.Process.Pid
		if shuttingDown(ctx) {
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			time.AfterFunc(grace, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
			return nil
		}
		return syscall.Kill(-pgid, syscall.SIGKILL)
	}
	cmd.WaitDelay = grace + 5*time.Second
	var stderr tailBuffer
	cmd.Stdout = os.Stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		return fmt.Errorf("exec %s: killed: %w", p.Argv[0], context.Cause(ctx))
	}
	return execResult(p, err, stderr.buf)
}

func execResult(p ExecPayload, err error, stderr []byte) error {
	if err == nil {
		return nil
	}
	if s := bytes.TrimSpace(stderr); len(s) > 0 {
		return fmt.Errorf("exec %s: %w: %s", p.Argv[0], err, s)
	}
	return fmt.Errorf("exec %s: %w", p.Argv[0], err)
}

// guarded runs the program under a guard process (see guard.go for the
// protocol): the worker writes the lease it holds to the guard's stdin
// every renewEvery, and reads the program's status from the guard's fd 3.
func (h *execHandler) guarded(ctx context.Context, job *consumer.Job, p ExecPayload, env []string) error {
	g, err := h.startGuard(job, p, env)
	if err != nil {
		return fmt.Errorf("exec %s: %w", p.Argv[0], err)
	}
	defer g.ctl.Close()
	defer g.statusR.Close()
	statusc := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(g.statusR, 4096))
		statusc <- string(b)
	}()
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()

	tick := time.NewTicker(renewEvery(job))
	defer tick.Stop()
	ctxDone := ctx.Done()
	var giveUp <-chan time.Time
	for {
		select {
		case werr := <-done:
			status := <-statusc
			if ctx.Err() != nil {
				return fmt.Errorf("exec %s: killed: %w", p.Argv[0], context.Cause(ctx))
			}
			return execResult(p, guardStatus(status, werr), g.stderr.buf)
		case <-tick.C:
			if g.hasLease {
				_, _ = io.WriteString(g.ctl, leaseLine(job))
			}
		case <-ctxDone:
			ctxDone = nil
			giveUp = time.After(h.stopGuard(ctx, g))
		case <-giveUp:
			// The guard did not finish: its stdin's end makes it kill
			// everything; failing that, it goes.
			giveUp = nil
			g.ctl.Close()
			time.AfterFunc(5*time.Second, func() { _ = g.cmd.Process.Kill() })
		}
	}
}

// guardProc is a started guard and the worker's ends of its pipes.
type guardProc struct {
	cmd      *exec.Cmd
	ctl      *os.File // the guard's stdin: lease, term, kill lines
	statusR  *os.File // the guard's fd 3: its one status line
	stderr   *tailBuffer
	hasLease bool
}

func leaseLine(job *consumer.Job) string {
	return "lease " + strconv.FormatInt(job.LeaseRemaining().Milliseconds(), 10) + "\n"
}

// startGuard starts `GuardPath __exec-guard ARGV...` with its first
// control line already in its stdin, so it starts the program only once it
// knows its deadline.
func (h *execHandler) startGuard(job *consumer.Job, p ExecPayload, env []string) (_ *guardProc, err error) {
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guard pipe: %w", err)
	}
	defer ctlR.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		ctlW.Close()
		return nil, fmt.Errorf("guard pipe: %w", err)
	}
	defer stW.Close()
	defer func() {
		if err != nil {
			ctlW.Close()
			stR.Close()
		}
	}()
	g := &guardProc{ctl: ctlW, statusR: stR, stderr: &tailBuffer{}, hasLease: job.LeaseRemaining() > 0}
	first := "nolease\n"
	if g.hasLease {
		first = leaseLine(job)
	}
	if _, err := io.WriteString(ctlW, first); err != nil {
		return nil, fmt.Errorf("guard pipe: %w", err)
	}
	g.cmd = exec.Command(h.cfg.GuardPath, append([]string{GuardCommand}, p.Argv...)...)
	g.cmd.Dir = p.Dir
	g.cmd.Env = env
	g.cmd.Stdin = ctlR
	g.cmd.ExtraFiles = []*os.File{stW}
	// Its own process group, so a terminal's Ctrl-C reaches the worker
	// only; no parent-death signal: the guard must outlive the worker to
	// clean up, and the pipe's end tells it the worker is gone.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	g.cmd.Stdout = os.Stdout
	g.cmd.Stderr = g.stderr
	// Descendants holding stderr cannot keep Wait waiting: the guard kills
	// them, and this bounds what is left if the guard itself is killed.
	g.cmd.WaitDelay = 5 * time.Second
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	return g, nil
}

// stopGuard asks the guard to stop the program (SIGTERM and a grace on
// shutdown, SIGKILL otherwise) and returns how long to wait for it.
func (h *execHandler) stopGuard(ctx context.Context, g *guardProc) time.Duration {
	wait := 5 * time.Second
	if shuttingDown(ctx) {
		_, _ = fmt.Fprintf(g.ctl, "term %d\n", h.cfg.KillGrace.Milliseconds())
		return wait + h.cfg.KillGrace
	}
	_, _ = io.WriteString(g.ctl, "kill\n")
	return wait
}

// renewEvery is how often the worker tells the guard its lease:
// min(ping_interval/2, 250ms).
func renewEvery(job *consumer.Job) time.Duration {
	d := maxRenewEvery
	if pi := time.Duration(job.Task.PingInterval) / 2; pi > 0 && pi < d {
		d = pi
	}
	return max(d, 10*time.Millisecond)
}

// guardStatus turns the guard's status line into the error Exec reports.
func guardStatus(status string, waitErr error) error {
	line, _, _ := strings.Cut(status, "\n")
	kind, detail, _ := strings.Cut(line, " ")
	switch kind {
	case "exit":
		code, err := strconv.Atoi(detail)
		if err != nil {
			break
		}
		if code == 0 {
			return nil
		}
		return fmt.Errorf("exit status %d", code)
	case "signal":
		n, err := strconv.Atoi(detail)
		if err != nil {
			break
		}
		return fmt.Errorf("signal: %s", syscall.Signal(n))
	case "start":
		return errors.New(detail)
	case "leaseout":
		// Killed for safety, not failed: the worker could not renew in
		// time (frozen, or its store slow), so a peer may take the task.
		// The attempt is given back without spending a retry; if the
		// lease really was lost, that write is refused anyway.
		return fmt.Errorf("stopped when its lease ran out with no renewal: %w", consumer.Snooze(0))
	}
	if waitErr != nil {
		return fmt.Errorf("guard: %w", waitErr)
	}
	return fmt.Errorf("guard: no status (%q)", line)
}

// readLines sends r's lines to the returned channel and closes it at EOF.
func readLines(r io.Reader) <-chan string {
	c := make(chan string)
	go func() {
		defer close(c)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c <- sc.Text()
		}
	}()
	return c
}
