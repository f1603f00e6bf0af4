// suspend.go stops the process on a shell's Ctrl-Z only between the
// embedded store's write transactions.

package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// writePauser is a store whose writes can be held off (sqlitestore.Store).
type writePauser interface {
	PauseWrites() (resume func())
}

// pausers are the stores this process opened for writing that can pause.
var pausers struct {
	sync.Mutex
	list []writePauser
}

// pauseOnSuspend registers s, if it can pause, with suspendCleanly.
func pauseOnSuspend(s any) {
	if p, ok := s.(writePauser); ok {
		pausers.Lock()
		pausers.list = append(pausers.list, p)
		pausers.Unlock()
	}
}

// suspendCleanly handles SIGTSTP (Ctrl-Z) until stop is called: it pauses
// every registered store's writes, then stops the process with SIGSTOP,
// and resumes the writes once the process is continued. A process stopped
// inside a write transaction would hold the embedded store's write lock
// for as long as it is stopped, stalling every other process on the file,
// and would be killed for it after sqlitestore.DefaultFrozenWriterKill.
func suspendCleanly() (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTSTP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-sig:
			}
			pausers.Lock()
			var resumes []func()
			for _, p := range pausers.list {
				resumes = append(resumes, p.PauseWrites())
			}
			stopSelf()
			for _, resume := range resumes {
				resume()
			}
			pausers.Unlock()
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
		wg.Wait()
	}
}
