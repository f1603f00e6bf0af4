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
func TestWALStaysBoundedUnderSteadyWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	s, err := Open(context.Background(), path, &Config{walRestartFrames: 500})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const writers, writes = 16, 600
	var g errgroup.Group
	var largest int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if fi, err := os.Stat(path + "-wal"); err == nil {
				largest = max(largest, fi.Size())
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	for w := range writers {
		g.Go(func() error {
			doc, err := task.NewTask(task.PublishParams{Key: fmt.Sprintf("w%d", w), Kind: "k"}, s.Now())
			if err != nil {
				return err
			}
			if doc, _, err = s.Insert(ctx, doc); err != nil {
				return err
			}
			for i := range writes {
				doc.Priority = i % 3 // touches an index as well as the row
				if err := s.Update(ctx, doc); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err = g.Wait()
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes: WAL %d bytes at the end, %d at most; %d commits", writers*writes, fi.Size(), largest, s.commits.Load())
	if limit := int64(8 << 20); max(largest, fi.Size()) > limit {
		t.Errorf("WAL reached %d bytes under steady writes, want at most %d: it is not being restarted", max(largest, fi.Size()), limit)
	}
}
