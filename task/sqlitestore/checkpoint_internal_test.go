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
	// Phases by commits, not by time: a loaded machine commits less in a
	// second, never differently. 300 commits write about twice the
	// restart threshold's frames, so by then the WAL has been restarted
	// and its file stays at its size from there on; without restarts it
	// grows as much again by 600.
	const writers, half = 16, 300
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
			for i := 0; s.commits.Load() < 2*half; i++ {
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
	for s.commits.Load() < half {
		time.Sleep(time.Millisecond)
	}
	first, commits := walSize(), s.commits.Load()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	second := walSize()
	t.Logf("WAL %d bytes after %d commits, %d after %d commits", first, commits, second, s.commits.Load())
	if grown := second - first; grown > first*3/4 { // without restarts it grows as much again
		t.Errorf("WAL grew by %d bytes in the second half of a steady load (from %d): it is not being restarted", grown, first)
	}
}
