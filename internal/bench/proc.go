package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a worker process a bench started, for any queue system.
type Process struct {
	Cmd *exec.Cmd
}

// Start starts cmd.
func Start(cmd *exec.Cmd) (*Process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Process{Cmd: cmd}, nil
}

// Kill kills the process at once (a crash, as far as its peers can tell)
// and reaps it.
func (p *Process) Kill() {
	p.Cmd.Process.Kill()
	p.Cmd.Wait()
}

// Stop asks the process to shut down (SIGTERM) and waits for it; one still
// running 15 s later is killed. A process already reaped is left alone.
func (p *Process) Stop() {
	if p.Cmd.ProcessState != nil {
		return
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.Cmd.Process.Kill()
		<-done
	}
}

// RSS reads a memory figure of the process (VmRSS, VmHWM) in bytes.
func (p *Process) RSS(field string) int64 { return ProcRSS(p.Cmd.Process.Pid, field) }

// ProcRSS reads a memory figure (VmRSS, VmHWM) of process pid from /proc,
// in bytes; 0 when it cannot.
func ProcRSS(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// ErrTimedOut is returned by Poll when done is not true within its limit.
var ErrTimedOut = errors.New("timed out")

// Poll calls done every interval until it returns true or an error, the
// limit passes (ErrTimedOut) or ctx ends.
func Poll(ctx context.Context, limit, every time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return ErrTimedOut
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
