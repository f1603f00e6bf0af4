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

// RunGuard runs argv as a guarded exec program and returns the guard's exit
// status (0 when it reported the program's status, whatever it was).
//
// Protocol: the worker writes lines on the guard's stdin — first
// "lease MS" (the lease the worker may count on, in milliseconds) or
// "nolease"; then "lease MS" again as it renews, "term MS" (SIGTERM now,
// SIGKILL after MS) or "kill". The guard writes one status line on fd 3:
// "exit CODE", "signal NUMBER" or "start ERROR". It makes itself a child
// subreaper, so every descendant of the program stays its descendant, and
// kills them all when stdin ends (the worker died), when the lease runs out
// by its own monotonic clock with no renewal (the worker is frozen), on
// "kill", after "term", on SIGTERM/SIGINT/SIGHUP, and once the program has
// exited (left-over background processes).
func RunGuard(argv []string) int {
	status := os.NewFile(3, "status")
	report := func(format string, args ...any) {
		if status != nil {
			_, _ = fmt.Fprintf(status, format+"\n", args...)
		}
	}
	logf := func(format string, args ...any) {
		_, _ = fmt.Fprintf(os.Stderr, "leasepool exec guard: "+format+"\n", args...)
	}
	if len(argv) == 0 {
		logf("no program to run")
		return 2
	}
	// A write to a closed stderr (the worker died) must fail, not kill the
	// guard before it cleans up. Notify, unlike Ignore, is not inherited by
	// the program.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	lines := readLines(os.Stdin)
	var deadline *time.Timer
	switch first, ok := <-lines; {
	case !ok:
		logf("worker gone before the program started")
		return 2
	case first == "nolease":
	default:
		d, err := parseMS(first, "lease")
		if err != nil {
			logf("%v", err)
			return 2
		}
		deadline = time.NewTimer(d)
	}
	if deadline == nil {
		deadline = time.NewTimer(time.Hour)
		deadline.Stop()
	}
	if err := setSubreaper(); err != nil {
		logf("cannot become a child subreaper, descendants may escape: %v", err)
	}

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setPdeathsig(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		report("start %s", oneLine(err.Error()))
		return 0
	}
	pgid := cmd.Process.Pid
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()

	killAll := func(why string) {
		if why != "" {
			logf("%s: killing the program and its descendants", why)
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		for _, pid := range descendants() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	var graceTimer <-chan time.Time
loop:
	for {
		select {
		case <-exited:
			break loop
		case line, ok := <-lines:
			switch {
			case !ok:
				killAll("the worker is gone")
				lines = nil
			case line == "kill":
				killAll("")
			case strings.HasPrefix(line, "term "):
				grace, err := parseMS(line, "term")
				if err != nil {
					logf("%v", err)
					grace = 0
				}
				_ = syscall.Kill(-pgid, syscall.SIGTERM)
				for _, pid := range descendants() {
					_ = syscall.Kill(pid, syscall.SIGTERM)
				}
				if graceTimer == nil {
					graceTimer = time.After(grace)
				}
			case strings.HasPrefix(line, "lease "):
				d, err := parseMS(line, "lease")
				if err != nil {
					logf("%v", err)
					continue
				}
				deadline.Reset(d)
			}
		case <-deadline.C:
			killAll("the lease ran out with no renewal from the worker")
		case <-graceTimer:
			killAll("the program outlived its grace period after SIGTERM")
		case sig := <-stop:
			killAll("got " + sig.String())
		}
	}
	// Whatever the program left behind goes with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	reapAll()

	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		report("exit 0")
	case errors.As(waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			report("signal %d", int(ws.Signal()))
		} else {
			report("exit %d", ee.ExitCode())
		}
	default:
		report("start %s", oneLine(waitErr.Error()))
	}
	return 0
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
