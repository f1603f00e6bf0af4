package builtin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// GuardCommand is the first argument that makes a binary calling GuardMain
// act as an exec guard.
const GuardCommand = "__exec-guard"

// GuardMain makes this process an exec guard, and exits, when it was
// started as one (os.Args[1] is GuardCommand); otherwise it returns at once.
// Call it first thing in main of any binary named as ExecConfig.GuardPath.
func GuardMain() {
	if len(os.Args) > 1 && os.Args[1] == GuardCommand {
		os.Exit(RunGuard(os.Args[2:]))
	}
}

// RunGuard runs args[1:] as a guarded exec program, started from the file
// args[0] (an absolute path: the worker looked it up and checked it), and
// returns the guard's exit status (0 when it reported the program's
// status, whatever it was).
//
// Protocol: the worker writes lines on the guard's stdin — first
// "lease MS" (the lease the worker may count on, in milliseconds) or
// "nolease"; then "lease MS" again as it renews, "term MS" (SIGTERM now,
// SIGKILL after MS) or "kill". The guard writes one status line on fd 3:
// "exit CODE", "signal NUMBER", "start ERROR" or "leaseout" (killed when the
// lease ran out). It makes itself a child
// subreaper, so every descendant of the program stays its descendant, and
// kills them all when stdin ends (the worker died), when the lease runs out
// by its own monotonic clock with no renewal (the worker is frozen), on
// "kill", after "term", on SIGTERM/SIGINT/SIGHUP, and once the program has
// exited (left-over background processes).
func RunGuard(args []string) int {
	g := &guard{status: os.NewFile(3, "status")}
	if len(args) < 2 {
		g.logf("no program to run")
		return 2
	}
	prog, argv := args[0], args[1:]
	// A write to a closed stderr (the worker died) must fail, not kill the
	// guard before it cleans up. Notify, unlike Ignore, is not inherited by
	// the program.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	g.stop = make(chan os.Signal, 1)
	signal.Notify(g.stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	g.lines = readLines(os.Stdin)
	if err := g.firstLease(); err != nil {
		g.logf("%v", err)
		return 2
	}
	if err := setSubreaper(); err != nil {
		g.logf("cannot become a child subreaper, descendants may escape: %v", err)
	}
	cmd := exec.Command(prog, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setPdeathsig(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		g.report("start %s", oneLine(err.Error()))
		return 0
	}
	g.pgid = cmd.Process.Pid
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	g.supervise(exited)
	// Whatever the program left behind goes with it.
	_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
	reapAll()
	g.reportExit(waitErr)
	return 0
}

// guard is one RunGuard: the worker's control lines, the lease deadline
// and the program's process group.
type guard struct {
	status   *os.File // fd 3: the one status line
	stop     chan os.Signal
	lines    <-chan string
	deadline *time.Timer // the lease the worker last reported
	pgid     int
	leaseOut bool // the program was killed because that lease ran out
}

func (g *guard) report(format string, args ...any) {
	if g.status != nil {
		_, _ = fmt.Fprintf(g.status, format+"\n", args...)
	}
}

func (g *guard) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(os.Stderr, "leasepool exec guard: "+format+"\n", args...)
}

// firstLease reads the worker's first line: "lease MS" or "nolease".
func (g *guard) firstLease() error {
	g.deadline = time.NewTimer(time.Hour)
	g.deadline.Stop()
	first, ok := <-g.lines
	switch {
	case !ok:
		return errors.New("worker gone before the program started")
	case first == "nolease":
		return nil
	}
	d, err := parseMS(first, "lease")
	if err != nil {
		return err
	}
	g.deadline.Reset(d)
	return nil
}

// signalAll sends sig to the program's group and every descendant.
func (g *guard) signalAll(sig syscall.Signal) {
	_ = syscall.Kill(-g.pgid, sig)
	for _, pid := range descendants() {
		_ = syscall.Kill(pid, sig)
	}
}

func (g *guard) killAll(why string) {
	if why != "" {
		g.logf("%s: killing the program and its descendants", why)
	}
	g.signalAll(syscall.SIGKILL)
}

// supervise acts on the worker's lines, the lease deadline and signals
// until the program exits.
func (g *guard) supervise(exited <-chan struct{}) {
	var graceTimer <-chan time.Time
	for {
		select {
		case <-exited:
			return
		case line, ok := <-g.lines:
			if !ok {
				g.killAll("the worker is gone")
				g.lines = nil
				continue
			}
			if grace, term := g.control(line); term && graceTimer == nil {
				graceTimer = time.After(grace)
			}
		case <-g.deadline.C:
			g.leaseOut = true
			g.killAll("the lease ran out with no renewal from the worker")
		case <-graceTimer:
			g.killAll("the program outlived its grace period after SIGTERM")
		case sig := <-g.stop:
			g.killAll("got " + sig.String())
		}
	}
}

// control carries out one line from the worker; after "term MS" it returns
// the grace period and true.
func (g *guard) control(line string) (time.Duration, bool) {
	switch {
	case line == "kill":
		g.killAll("")
	case strings.HasPrefix(line, "term "):
		grace, err := parseMS(line, "term")
		if err != nil {
			g.logf("%v", err)
		}
		g.signalAll(syscall.SIGTERM)
		return grace, true
	case strings.HasPrefix(line, "lease "):
		d, err := parseMS(line, "lease")
		if err != nil {
			g.logf("%v", err)
			break
		}
		g.deadline.Reset(d)
	}
	return 0, false
}

func (g *guard) reportExit(waitErr error) {
	var ee *exec.ExitError
	switch {
	case g.leaseOut:
		g.report("leaseout")
	case waitErr == nil:
		g.report("exit 0")
	case errors.As(waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			g.report("signal %d", int(ws.Signal()))
		} else {
			g.report("exit %d", ee.ExitCode())
		}
	default:
		g.report("start %s", oneLine(waitErr.Error()))
	}
}

// reapAll kills and reaps every remaining descendant (the program's
// group is gone, but background processes it started may remain, and as a
// subreaper the guard inherits them), until none is left.
func reapAll() {
	giveUp := time.Now().Add(10 * time.Second)
	for time.Now().Before(giveUp) {
		for _, pid := range descendants() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.ECHILD) {
				return
			}
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, _ = fmt.Fprintf(os.Stderr, "leasepool exec guard: descendants still alive after 10s of SIGKILL: %v\n", descendants())
}

func parseMS(line, word string) (time.Duration, error) {
	v, ok := strings.CutPrefix(line, word+" ")
	ms, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("bad control line %q", line)
	}
	return time.Duration(max(ms, 0)) * time.Millisecond, nil
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
