//go:build unix && !linux

package builtin

import (
	"errors"
	"syscall"
)

// setSubreaper is Linux only: elsewhere a descendant that leaves the
// program's process group and is orphaned escapes the guard.
func setSubreaper() error { return errors.New("child subreapers are Linux only") }

func setPdeathsig(*syscall.SysProcAttr) {}

// descendants would need /proc: elsewhere the guard kills the program's
// process group only.
func descendants() []int { return nil }
