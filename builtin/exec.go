package builtin

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/tracing"
)

// DefaultKillGrace is ExecConfig.KillGrace's default.
const DefaultKillGrace = 5 * time.Second

// maxRenewEvery bounds how often the worker tells a guard its lease.
const maxRenewEvery = 250 * time.Millisecond

// ExecConfig configures the exec kind's handler.
type ExecConfig struct {
	// GuardPath is the binary that guards each exec program: it must call
	// GuardMain first thing in main (the leasepool CLI does; pass its
	// os.Executable()). It is started as
	// `GuardPath __exec-guard PROGRAM ARGV...`.
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
	// Allow, when not empty, is the only programs that may run: path.Match
	// patterns ("/usr/local/bin/*", "/opt/jobs/report") matched against
	// the program's absolute path, argv[0] looked up in the PATH of the
	// program's environment (or made absolute against Dir). Any other
	// program is refused with a *NotAllowedError and never started, and a
	// payload may then not set the variables that make the loader or a
	// shell or interpreter run code the list never saw (LD_*, DYLD_*,
	// BASH_FUNC_*, BASH_ENV, PYTHON*, PERL*, NODE_*...). Each pattern must
	// be absolute. An allowed program still takes any arguments and other
	// payload env: allow only programs safe in the hands of whoever can
	// publish.
	Allow []string
	// PassEnv names variables of the worker's environment passed to
	// programs besides the minimal set (see MinimalEnv).
	PassEnv []string
}

// MinimalEnv is the worker's environment a program gets by default, by
// name (LC_* stands for every locale variable). Nothing else of the
// worker's environment reaches a program unless ExecConfig.PassEnv names
// it: a worker's environment holds its credentials (LEASEPOOL_TOKEN, the
// store URL, the MQTT password, cloud keys), and a program runs whatever
// a publisher asked.
var MinimalEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TZ", "TMPDIR", "TERM", "SHELL"}

// ErrNotAllowed is wrapped by the error of an exec attempt whose program
// ExecConfig.Allow does not list.
var ErrNotAllowed = errors.New("exec: program not allowed")

// NotAllowedError is an exec attempt refused by ExecConfig.Allow (the
// worker's --exec-allow); the program did not start.
type NotAllowedError struct {
	Program string // the absolute path refused
}

func (e *NotAllowedError) Error() string {
	return fmt.Sprintf("exec: program %q is not allowed by --exec-allow", e.Program)
}

// Unwrap makes it ErrNotAllowed for errors.Is.
func (e *NotAllowedError) Unwrap() error { return ErrNotAllowed }

// checkAndFillDefaults refuses a bad config and sets the defaults of
// its zero fields.
func (c *ExecConfig) checkAndFillDefaults() error {
	if c.KillGrace < 0 {
		return fmt.Errorf("builtin.ExecConfig: KillGrace must not be negative, got %s", c.KillGrace)
	}
	for _, p := range c.Allow {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("builtin.ExecConfig: Allow: pattern %q must be an absolute path (it is matched against the program's absolute path)", p)
		}
		if _, err := path.Match(p, "/"); err != nil {
			return fmt.Errorf("builtin.ExecConfig: Allow: pattern %q: %w", p, err)
		}
	}
	for _, n := range c.PassEnv {
		if n == "" || strings.ContainsAny(n, "=\x00") {
			return fmt.Errorf("builtin.ExecConfig: PassEnv: %q is not a variable name", n)
		}
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
// with the worker's MinimalEnv and PassEnv variables, the payload's env,
// and LEASEPOOL_TASK_KEY, LEASEPOOL_ATTEMPT, LEASEPOOL_WORKER_ID and,
// when the job holds a lease, LEASEPOOL_LEASE_DEADLINE (RFC 3339 wall time
// at which the lease held at start ends; a hint only, since the worker
// renews it), and TRACEPARENT (and TRACESTATE) of the attempt's span when
// the task carries a trace context. The program is argv[0] looked up in that environment's PATH
// (relative to the payload's dir if it holds a slash), and must match
// ExecConfig.Allow when it is set. Exit status 0 is success; a failure carries the tail of the
// program's stderr. The program runs in its own process group. On lease
// loss or cancel the group is killed at once (SIGKILL); on graceful
// shutdown it gets SIGTERM, then SIGKILL after KillGrace.
//
// With a GuardPath, a guard process owns the program and every process it
// starts, and kills them all when the worker dies, when the lease it was
// last told of runs out (a frozen worker), when the worker asks, and when
// the program exits (leftover background processes).
func NewExec(cfg ExecConfig) (consumer.HandlerFunc, error) {
	if err := cfg.checkAndFillDefaults(); err != nil {
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
	if len(h.cfg.Allow) > 0 {
		for k := range p.Env {
			if loadsCode(k) {
				return fmt.Errorf("exec: payload: env: %q is not allowed with --exec-allow (it loads code into the program)", k)
			}
		}
	}
	env := h.environ(p)
	prog, err := findProgram(p.Argv[0], lookupEnv(env, "PATH"), p.Dir)
	if err != nil {
		return fmt.Errorf("exec %s: %w", p.Argv[0], err)
	}
	if len(h.cfg.Allow) > 0 && !slices.ContainsFunc(h.cfg.Allow, func(pat string) bool {
		ok, _ := path.Match(pat, prog)
		return ok
	}) {
		return &NotAllowedError{Program: prog}
	}
	env = append(env,
		"LEASEPOOL_TASK_KEY="+job.Task.Key,
		"LEASEPOOL_ATTEMPT="+strconv.Itoa(job.Attempt),
		"LEASEPOOL_WORKER_ID="+job.WorkerID,
	)
	if left := job.LeaseRemaining(); left > 0 {
		env = append(env, "LEASEPOOL_LEASE_DEADLINE="+time.Now().Add(left).Format(time.RFC3339Nano))
	}
	// Last, so that the attempt's span, not a payload's variable, is the
	// program's parent.
	env = append(env, tracing.Environ(ctx)...)
	if h.cfg.GuardPath == "" {
		return h.direct(ctx, prog, p, env)
	}
	return h.guarded(ctx, job, prog, p, env)
}

// environ is the program's environment before leasepool's own variables:
// the worker's variables MinimalEnv and PassEnv name, then the payload's.
func (h *execHandler) environ(p ExecPayload) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if passed(name, h.cfg.PassEnv) {
			env = append(env, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		env = append(env, k+"="+p.Env[k])
	}
	return env
}

func passed(name string, extra []string) bool {
	if strings.HasPrefix(name, "LC_") {
		return true
	}
	return slices.Contains(MinimalEnv, name) || slices.Contains(extra, name)
}

// codeEnvPrefixes and codeEnvNames are the variables through which the
// dynamic loader or a common shell or interpreter runs code of the
// variable's choosing: a bash script calling `cat` runs the function in
// BASH_FUNC_cat%%, a Perl one the code in PERL5OPT. With an allow-list a
// payload may set none of them. The list cannot be complete: an allowed
// program must still not read code from its environment.
var (
	codeEnvPrefixes = []string{"LD_", "DYLD_", "BASH_FUNC_", "PYTHON", "PERL", "RUBY", "NODE_", "LUA_", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS"}
	codeEnvNames    = []string{"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "GCONV_PATH", "GIT_EXEC_PATH", "GIT_SSH_COMMAND", "PHPRC", "PHP_INI_SCAN_DIR"}
)

// loadsCode reports whether a payload's variable name makes the loader or
// an interpreter run code (see codeEnvPrefixes).
func loadsCode(name string) bool {
	return slices.Contains(codeEnvNames, name) || slices.ContainsFunc(codeEnvPrefixes, func(p string) bool {
		return strings.HasPrefix(name, p)
	})
}

// lookupEnv is the last value of name in env, as exec uses it.
func lookupEnv(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v
		}
	}
	return ""
}

// findProgram returns the absolute path of the program argv0 names: a
// name with a slash is taken relative to dir (or the worker's directory),
// any other is looked up in pathList, the program's own PATH. Relative
// PATH entries are skipped, as exec.LookPath refuses them: what they find
// depends on the directory. The program then runs by this path, so what
// ran is what was checked.
func findProgram(argv0, pathList, dir string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		p, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		return p, executable(p)
	}
	for _, d := range filepath.SplitList(pathList) {
		if !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, argv0)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w in PATH %q", exec.ErrNotFound, pathList)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return &fs.PathError{Op: "exec", Path: p, Err: fs.ErrPermission}
	}
	return nil
}

func shuttingDown(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), consumer.ErrShutdown)
}

// direct runs the program as the worker's child.
func (h *execHandler) direct(ctx context.Context, prog string, p ExecPayload, env []string) error {
	cmd := exec.CommandContext(ctx, prog, p.Argv[1:]...)
	cmd.Args[0] = p.Argv[0]
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
func (h *execHandler) guarded(ctx context.Context, job *consumer.Job, prog string, p ExecPayload, env []string) error {
	g, err := h.startGuard(job, prog, p, env)
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

// startGuard starts `GuardPath __exec-guard PROGRAM ARGV...` with its
// first control line already in its stdin, so it starts the program only
// once it knows its deadline.
func (h *execHandler) startGuard(job *consumer.Job, prog string, p ExecPayload, env []string) (_ *guardProc, err error) {
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
	g.cmd = exec.Command(h.cfg.GuardPath, append([]string{GuardCommand, prog}, p.Argv...)...)
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
