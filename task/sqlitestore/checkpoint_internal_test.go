package sqlitestore

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/leasepool/leasepool/internal/testutil"
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
	// Two phases with as many commits each: the first at least 300
	// commits (about twice the restart threshold's frames) and three of
	// the checkpointer's ticks, so by its end the WAL has been restarted
	// and its file stays at its size from there on; without restarts it
	// grows as much again in the second. A fast machine makes more
	// commits per tick, a loaded one fewer, never a different outcome.
	const writers, half = 16, 300
	start := time.Now()
	var stopAt atomic.Int64
	stopAt.Store(math.MaxInt64)
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
			for i := 0; s.commits.Load() < stopAt.Load(); i++ {
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
	testutil.EventuallyEvery(t, time.Minute, time.Millisecond, "half the commits, over three checkpoint periods", func() bool {
		return s.commits.Load() >= half && time.Since(start) >= 3*checkpointEvery
	})
	first, commits := walSize(), s.commits.Load()
	stopAt.Store(2 * commits)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	second := walSize()
	t.Logf("WAL %d bytes after %d commits, %d after %d commits", first, commits, second, s.commits.Load())
	if grown := second - first; grown > first*3/4 { // without restarts it grows as much again
		t.Errorf("WAL grew by %d bytes in the second half of a steady load (from %d): it is not being restarted", grown, first)
	}
}
