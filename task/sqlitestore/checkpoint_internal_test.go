package sqlitestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/leasepool/leasepool/task"
)

// TestWALStaysBoundedUnderSteadyWrites: writers that never pause must not
// grow the WAL without end. Passive checkpoints alone never complete while
// commits keep landing, and SQLite restarts the WAL only after one does.
// The WAL file never shrinks, so its size is its high-water mark: it grows
// through the first half of a steady load and must not keep growing in
// the second (without restarts it grows in proportion to the writes).
func TestWALStaysBoundedUnderSteadyWrites(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s, err := Open(context.Background(), path, &Config{walRestartFrames: 500})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const writers, half = 16, 1500 * time.Millisecond
	start := time.Now()
	end := start.Add(2 * half)
	var g errgroup.Group
	for w := range writers {
		g.Go(func() error {
			doc, err := task.NewTask(task.PublishParams{Key: fmt.Sprintf("w%d", w), Kind: "k"}, s.Now())
			if err != nil {
				return err
			}
			if doc, _, err = s.Insert(ctx, doc); err != nil {
				return err
			}
			for i := 0; time.Now().Before(end); i++ {
				doc.Priority = i % 3 // touches an index as well as the row
				if err := s.Update(ctx, doc); err != nil {
					return err
				}
			}
			return nil
		})
	}
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	time.Sleep(time.Until(start.Add(half)))
	first, commits := walSize(), s.commits.Load()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	second := walSize()
	t.Logf("WAL %d bytes after %s (%d commits), %d after %s (%d commits)", first, half, commits, second, 2*half, s.commits.Load())
	if grown := second - first; grown > first*3/4 { // without restarts it grows as much again
		t.Errorf("WAL grew by %d bytes in the second half of a steady load (from %d): it is not being restarted", grown, first)
	}
}
