// fence.go frees the write lock from a process frozen while holding it.

package sqlitestore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
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
// and kills it once it has been seen stopped for FrozenWriterKill.
func (s *Store) watchHolder(acquired <-chan struct{}) {
	tick := time.NewTicker(fenceProbe)
	defer tick.Stop()
	var frozen int // the holder last seen stopped, 0 if none
	var since time.Time
	for {
		pid := s.lockHolder()
		switch {
		case pid == 0 || !stopped(pid):
			frozen = 0
		case pid != frozen:
			frozen, since = pid, time.Now()
			s.log.Warn("the store's write lock is held by a stopped process; every write waits for it",
				slog.Int("pid", pid), slog.Duration("kill_after", s.cfg.FrozenWriterKill))
		case time.Since(since) >= s.cfg.FrozenWriterKill:
			err := syscall.Kill(pid, syscall.SIGKILL)
			s.log.Error("killed a process stopped while holding the store's write lock",
				slog.Int("pid", pid), slog.Duration("stopped_for", time.Since(since).Round(time.Millisecond)), slog.Any("err", err))
			frozen = 0
		}
		select {
		case <-acquired:
			return
		case <-tick.C:
		}
	}
}

// lockHolder returns the pid of another process holding the flock on the
// store's -lock file, from /proc/locks; 0 when none or unknown (not
// Linux).
func (s *Store) lockHolder() int {
	var st syscall.Stat_t
	if err := syscall.Stat(s.writeLock.Name(), &st); err != nil {
		return 0
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	return flockHolder(locks, uint64(st.Dev), uint64(st.Ino), os.Getpid()) // int32 and uint64 on darwin
}

// flockHolder finds, in the text of /proc/locks, the process holding a
// FLOCK on the file with device dev and inode ino, other than self.
// A line reads "1: FLOCK  ADVISORY  WRITE 4711 fd:01:123456 0 EOF"; a
// waiter's line has "->" after the number.
func flockHolder(locks []byte, dev, ino uint64, self int) int {
	file := fmt.Sprintf("%02x:%02x:%d", devMajor(dev), devMinor(dev), ino)
	sc := bufio.NewScanner(bytes.NewReader(locks))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != file {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid != self {
			return pid
		}
	}
	return 0
}

// devMajor and devMinor split a Linux dev_t as the kernel's new_encode_dev
// packs it.
func devMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&^0xfff }
func devMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&^0xff }

// stopped reports whether process pid is stopped by a signal (state T in
// /proc/PID/stat). A process stopped by a debugger (state t) is left
// alone.
func stopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The command name in parentheses may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// PauseWrites waits for this Store's write transaction in progress, if
// any, and keeps it from starting another until resume is called. A
// process about to stop itself (on a shell's Ctrl-Z) calls it first, so
// that it does not stop holding the write lock that every other process on
// the file waits for.
func (s *Store) PauseWrites() (resume func()) {
	s.wmu.Lock()
	return s.wmu.Unlock
}
