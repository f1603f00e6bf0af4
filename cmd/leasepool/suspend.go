// suspend.go stops the process on a shell's Ctrl-Z only between the
// embedded store's write transactions.

package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/leasepool/leasepool/task/sqlitestore"
)

// suspendCleanly handles SIGTSTP (Ctrl-Z) until stop is called: it pauses
// the writes of every embedded store the process has open, stops the
// process (SIGSTOP) and resumes the writes once it is continued. Stopped
// inside a write transaction, the process would hold the store's write
// lock as long as it stayed stopped, stalling every other process on the
// file, and be killed for it (sqlitestore.Config.FrozenWriterKill). Unlike
// the default action, a SIGTSTP sent to an orphaned process group stops
// it too. An inherited SIG_IGN is kept.
func suspendCleanly() (stop func()) {
	if signal.Ignored(syscall.SIGTSTP) {
		return func() {}
	}
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
			resume := sqlitestore.PauseAllWrites()
			// A second Ctrl-Z while pausing is this stop, so it is drained
			// before stopping: one that arrives after the continue is a new
			// stop and stays queued for the next pass.
			select {
			case <-sig:
			default:
			}
			stopSelf()
			resume()
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
		wg.Wait()
	}
}
