package builtin

import "syscall"

// procAttr puts the process in its own group, so a cancel kills its
// children too, and has the kernel kill it if the worker dies (SIGKILL), so
// an orphan cannot keep acting on a task a peer has taken over.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
