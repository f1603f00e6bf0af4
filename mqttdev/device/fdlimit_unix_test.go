//go:build unix

package device

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestRaiseFileLimit: a need within the hard limit is met (the soft limit
// raised if need be); one past it is refused, naming the hard limit.
func TestRaiseFileLimit(t *testing.T) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if got, err := RaiseFileLimit(int(min(l.Max, 1024))); err != nil || got < min(l.Max, 1024) {
		t.Errorf("RaiseFileLimit(%d) = %d, %v; want at least that, no error", min(l.Max, 1024), got, err)
	}
	if l.Max >= 1<<40 {
		t.Skipf("hard limit %d: no need past it to try", l.Max)
	}
	_, err := RaiseFileLimit(int(l.Max) + 1)
	if err == nil || !strings.Contains(err.Error(), "the hard limit is "+strconv.FormatUint(l.Max, 10)) {
		t.Errorf("RaiseFileLimit(hard+1) = %v, want an error naming the hard limit %d", err, l.Max)
	}
}
