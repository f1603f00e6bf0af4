package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestWorkerExitsWhenItsStoreBreaks: a worker whose embedded store's -wal
// file is deleted under it cannot renew its registration; past
// --store-fail-timeout it exits with status 1 naming the flag, instead of
// logging warnings for ever, and a worker started afresh runs the tasks
// published since.
func TestWorkerExitsWhenItsStoreBreaks(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "store.db")
	url := "sqlite:" + dbPath
	s, err := sqlitestore.Open(context.Background(), dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, url, "w", "--kinds", "noop", "--store-fail-timeout", "2s")
	logPath := w.cmd.Stdout.(*os.File).Name()
	if _, stderr, code := runCLI(t, "--store", url, "publish", "before", "--kind", "noop"); code != 0 {
		t.Fatalf("publish: exit %d: %s", code, stderr)
	}
	eventually(t, 30*time.Second, "the first task to succeed", func() bool {
		d, err := s.Get(context.Background(), "before")
		return err == nil && d.State == task.StateSucceeded
	})
	s.Close() // the worker alone holds the store when it breaks
	if err := os.Remove(dbPath + "-wal"); err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	eventually(t, 60*time.Second, "the worker to exit", func() bool {
		pid, err := syscall.Wait4(w.cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
		return err == nil && pid == w.cmd.Process.Pid
	})
	if !ws.Exited() || ws.ExitStatus() != 1 {
		t.Errorf("worker wait status %v, want exit status 1", ws)
	}
	if b, _ := os.ReadFile(logPath); !strings.Contains(string(b), "--store-fail-timeout") {
		t.Errorf("the worker's log does not name --store-fail-timeout:\n%s", tail(string(b), 2000))
	}

	// A worker started afresh opens the store anew and runs what waits.
	for i := range 5 {
		if _, stderr, code := runCLI(t, "--store", url, "publish", fmt.Sprintf("after-%d", i), "--kind", "noop"); code != 0 {
			t.Fatalf("publish: exit %d: %s", code, stderr)
		}
	}
	startWorker(t, url, "w", "--kinds", "noop")
	if s, err = sqlitestore.Open(context.Background(), dbPath, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	eventually(t, 30*time.Second, "the tasks published since to succeed", func() bool {
		for i := range 5 {
			d, err := s.Get(context.Background(), fmt.Sprintf("after-%d", i))
			if err != nil || d.State != task.StateSucceeded {
				return false
			}
		}
		return true
	})
}
