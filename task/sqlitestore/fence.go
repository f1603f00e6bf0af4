// fence.go frees the write lock from a process frozen while holding it.

package sqlitestore

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultFrozenWriterKill is Config.FrozenWriterKill's default.
const DefaultFrozenWriterKill = 5 * time.Second

// fenceProbe is how often a writer waiting for the write lock looks at
// its holder.
const fenceProbe = 250 * time.Millisecond

// waitWriteLock blocks until this process holds the cross-process write
// lock on fd. While it waits, a watcher looks at the lock's holder: a
// process stopped (SIGSTOP, a shell's Ctrl-Z) inside a write transaction
// keeps the lock for as long as it is stopped, and nothing can be written
// to the file meanwhile: every worker's renewals stall and every lease on
// the store lapses. Once the same holder has been seen stopped for
// Config.FrozenWriterKill, it is SIGKILLed: the kernel drops its locks,
// SQLite discards its uncommitted transaction, and its tasks are taken
// over when their leases run out, as for any crashed worker.
func (s *Store) waitWriteLock(fd int) error {
	if s.cfg.FrozenWriterKill > 0 {
		acquired, watched := make(chan struct{}), make(chan struct{})
		watch := time.AfterFunc(fenceProbe, func() {
			defer close(watched)
			s.watchHolder(acquired)
		})
		defer func() {
			close(acquired)
			if !watch.Stop() {
				<-watched
			}
		}()
	}
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// watchHolder watches the write lock's holder until acquired is closed,
// and kills it once it has been seen stopped, using no CPU, for
// FrozenWriterKill.
func (s *Store) watchHolder(acquired <-chan struct{}) {
	tick := time.NewTicker(fenceProbe)
	defer tick.Stop()
	var frozen procStat // the holder last seen stopped; pid 0 if none
	var since time.Time
	warned := 0
	for {
		pid := s.lockHolder()
		st, ok := readProcStat(pid)
		switch {
		case pid == 0 || !ok || st.state != 'T':
			frozen = procStat{}
		case st != frozen:
			// Another holder, or the same one having run since.
			frozen, since = st, time.Now()
			if warned != pid {
				warned = pid
				s.log.Warn("the store's write lock is held by a stopped process; every write waits for it",
					slog.Int("pid", pid), slog.Duration("kill_after", s.cfg.FrozenWriterKill))
			}
		case time.Since(since) >= s.cfg.FrozenWriterKill:
			s.killFrozen(frozen, since)
			frozen = procStat{}
		}
		select {
		case <-acquired:
			return
		case <-tick.C:
		}
	}
}

// killFrozen SIGKILLs the holder seen stopped as st since since, through a
// handle on the process taken before checking once more that it is that
// process (its start time), still stopped and still the holder.
func (s *Store) killFrozen(st procStat, since time.Time) {
	p, err := os.FindProcess(st.pid)
	if err == nil {
		defer p.Release()
		if now, ok := readProcStat(st.pid); !ok || now != st || s.lockHolder() != st.pid {
			return // it moved, ended or let go: the next probe looks again
		}
		err = p.Signal(syscall.SIGKILL)
	}
	stoppedFor := slog.Duration("stopped_for", time.Since(since).Round(time.Millisecond))
	if err != nil {
		s.log.Error("could not kill the process stopped while holding the store's write lock",
			slog.Int("pid", st.pid), stoppedFor, slog.Any("err", err))
		return
	}
	s.log.Error("killed a process stopped while holding the store's write lock", slog.Int("pid", st.pid), stoppedFor)
}

// lockHolder returns the pid of another process holding the flock on the
// store's -lock file; 0 when none or unknown (not Linux). /proc/locks
// names the file by its filesystem's device, which stat does not always
// report (btrfs, overlayfs): a candidate found by inode is confirmed by
// having the file open.
func (s *Store) lockHolder() int {
	lock, err := s.writeLock.Stat()
	if err != nil {
		return 0
	}
	st, ok := lock.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	for _, pid := range flockHolders(locks, uint64(st.Ino), os.Getpid()) {
		if hasOpen(pid, lock) {
			return pid
		}
	}
	return 0
}

// flockHolders lists, from the text of /proc/locks, the processes other
// than self holding a FLOCK on a file with inode ino. A line reads
// "1: FLOCK  ADVISORY  WRITE 4711 fd:01:123456 0 EOF"; a waiter's line has
// "->" after the number; a lock held on another host has a negative pid.
func flockHolders(locks []byte, ino uint64, self int) []int {
	suffix := ":" + strconv.FormatUint(ino, 10)
	var out []int
	sc := bufio.NewScanner(bytes.NewReader(locks))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" || !strings.HasSuffix(f[5], suffix) {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 && pid != self {
			out = append(out, pid)
		}
	}
	return out
}

// hasOpen reports whether process pid has the file open.
func hasOpen(pid int, file os.FileInfo) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if fi, err := os.Stat(dir + fd.Name()); err == nil && os.SameFile(fi, file) {
			return true
		}
	}
	return false
}

// procStat is what /proc/PID/stat says of a process: its state (T:
// stopped by a signal; a debugger's stop, t, is left alone), the CPU time
// it has used and its start time, which tells it from a later process
// given the same pid.
type procStat struct {
	pid        int
	state      byte
	cpu, start uint64
}

func readProcStat(pid int) (procStat, bool) {
	if pid <= 0 {
		return procStat{}, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// After the command name in parentheses (which may hold spaces and
	// parentheses): state is field 3, utime 14, stime 15, starttime 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, false
	}
	return procStat{pid: pid, state: f[0][0], cpu: utime + stime, start: start}, true
}

// writable is every Store of this process open for writing.
var writable struct {
	sync.Mutex
	stores map[*Store]bool
}

func registerWritable(s *Store, open bool) {
	writable.Lock()
	defer writable.Unlock()
	if !open {
		delete(writable.stores, s)
		return
	}
	if writable.stores == nil {
		writable.stores = map[*Store]bool{}
	}
	writable.stores[s] = true
}

// PauseAllWrites waits for the write in progress (one still waiting for
// the write lock included) of every Store this process has open for
// writing, those still opening included, and keeps them from starting
// another until resume is called. A process about to stop itself (on a
// shell's Ctrl-Z) calls it first, so that it does not stop holding the
// write lock that every other process on the file waits for.
func PauseAllWrites() (resume func()) {
	writable.Lock()
	stores := make([]*Store, 0, len(writable.stores))
	for s := range writable.stores {
		stores = append(stores, s)
	}
	writable.Unlock()
	for _, s := range stores {
		s.wmu.Lock()
	}
	return func() {
		for _, s := range stores {
			s.wmu.Unlock()
		}
	}
}
