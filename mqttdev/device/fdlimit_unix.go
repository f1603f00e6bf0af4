//go:build unix

package device

import (
	"fmt"
	"syscall"
)

// RaiseFileLimit makes sure this process may hold at least need open
// files, each simulated device holding one connection: it raises the soft
// limit (RLIMIT_NOFILE) up to the hard limit if need be, and fails,
// naming both limits, when even the hard limit is too low. It returns
// the soft limit in force.
func RaiseFileLimit(need int) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("open files limit: %w", err)
	}
	if l.Cur >= uint64(need) {
		return l.Cur, nil
	}
	if l.Max < uint64(need) {
		return l.Cur, fmt.Errorf("open files limit: %d devices need about %d open files, the hard limit is %d (soft %d): raise it (ulimit -Hn, as root), or split the fleet across processes (--first)",
			need-fileHeadroom, need, l.Max, l.Cur)
	}
	want := l
	want.Cur = uint64(need)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return l.Cur, fmt.Errorf("open files limit: raising %d to %d: %w", l.Cur, need, err)
	}
	return want.Cur, nil
}
