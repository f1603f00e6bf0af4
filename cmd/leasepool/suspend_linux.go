package main

import (
	"os"
	"runtime"
	"syscall"
)

// stopSelf stops the process and returns once it is continued. The
// SIGSTOP goes to this thread (tgkill): a process-wide one may be taken by
// another thread, and this one would run on and resume the writes before
// the process stops.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
