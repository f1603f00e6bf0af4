package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/stats"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

// sampleReads counts one worker's reads for the charts' queue sample.
type sampleReads struct {
	task.Store
	queue, minute atomic.Int64
}

func (s *sampleReads) Stats(ctx context.Context) (task.Stats, error) {
	s.queue.Add(1)
	return s.Store.Stats(ctx)
}

func (s *sampleReads) GetDocument(ctx context.Context, namespace, id string) (task.Document, error) {
	if namespace == stats.MinuteNamespace {
		s.minute.Add(1)
	}
	return s.Store.GetDocument(ctx, namespace, id)
}

// TestOneBookkeeperSamplesTheQueue: of three idle workers on one store,
// one at a time is the bookkeeper, and only it reads the queue and the
// minute's bucket for the charts' sample; the others read nothing for it.
// About 7 s: every worker's first flush comes 5 s after its start.
func TestOneBookkeeperSamplesTheQueue(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	var ws []*worker.Worker
	var counted []*sampleReads
	for i := range 3 {
		c := &sampleReads{Store: st}
		w, err := worker.New(worker.Config{Store: c, ID: fmt.Sprintf("w%d", i), Kinds: []string{"noop"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Stop(context.Background()) })
		ws, counted = append(ws, w), append(counted, c)
	}
	started := time.Now()
	keeper := -1
	testutil.EventuallyEvery(t, 30*time.Second, 50*time.Millisecond, "a bookkeeper to sample the queue", func() bool {
		keeper = -1
		for i, w := range ws {
			if w.Bookkeeper() {
				if keeper >= 0 {
					t.Fatalf("workers %d and %d both bookkeepers", keeper, i)
				}
				keeper = i
			}
		}
		return keeper >= 0 && counted[keeper].queue.Load() > 0
	})
	// Every worker has flushed at least once by now. Another's flush
	// reads and writes nothing, which is the point: no fact shows it but
	// the time it comes at.
	time.Sleep(time.Until(started.Add(stats.DefaultEvery + time.Second)))
	for i, c := range counted {
		if i != keeper && (c.queue.Load() > 0 || c.minute.Load() > 0) {
			t.Errorf("worker %d, not the bookkeeper, read the queue %d times and minute buckets %d times, want none",
				i, c.queue.Load(), c.minute.Load())
		}
	}
	if !ws[keeper].Bookkeeper() {
		t.Errorf("worker %d no longer the bookkeeper of an idle cluster", keeper)
	}
}
