//go:build unix && !linux

package builtin

import "syscall"

// procAttr puts the process in its own group, so a cancel kills its
// children too. Without Linux's parent-death signal, a process outlives a
// worker killed with SIGKILL.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
