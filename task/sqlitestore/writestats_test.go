package sqlitestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// TestWriteStatsCountTheLock: commits and the writes they carried are
// counted, and a write made while another process holds the file's write
// lock counts the wait, and its own commit the time it held the lock.
func TestWriteStatsCountTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s := open(t, path, nil)
	before := s.WriteStats()
	const n = 5
	for i := range n {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprintf("k%d", i), Kind: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	after := s.WriteStats()
	if got := after.Writes - before.Writes; got < n {
		t.Errorf("%d writes counted for %d publishes", got, n)
	}
	if got := after.Commits - before.Commits; got < 1 || got > after.Writes-before.Writes {
		t.Errorf("%d commits for %d writes", got, after.Writes-before.Writes)
	}
	if after.LockHeld <= before.LockHeld {
		t.Errorf("lock held %v after the publishes, %v before", after.LockHeld, before.LockHeld)
	}
	start := before

	// Another process's hold, as flock sees it: a second open file
	// description of the lock file.
	other, err := os.OpenFile(path+"-lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fd := int(other.Fd())
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	// The store let the lock go, so its last hold is counted (a caller is
	// answered before the writer lets go): the phases are parts of it.
	locked := s.WriteStats()
	begin, stmts, commit := locked.Begin-start.Begin, locked.Statements-start.Statements, locked.Commit-start.Commit
	if held := locked.LockHeld - start.LockHeld; begin <= 0 || stmts <= 0 || commit <= 0 || begin+stmts+commit > held {
		t.Errorf("phases begin %v, statements %v, commit %v of the lock held %v", begin, stmts, commit, held)
	}
	const hold = 300 * time.Millisecond
	released := make(chan struct{})
	time.AfterFunc(hold, func() { syscall.Flock(fd, syscall.LOCK_UN); close(released) })
	defer func() { <-released }()
	before = s.WriteStats()
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "waited", Kind: "noop"}); err != nil {
		t.Fatal(err)
	}
	after = s.WriteStats()
	if got := after.LockWait - before.LockWait; got < hold*2/3 {
		t.Errorf("waited %v for a lock held %v by another process", got, hold)
	}
	if after.Commits <= before.Commits {
		t.Errorf("no commit counted for the publish that waited")
	}
}
