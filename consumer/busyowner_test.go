package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// TestBusyOwnersPinnedAndLockedTasksRun: on one embedded store file, B's
// only slot is taken for good; a backlog five times A's heap, a third
// pinned to both workers and a third taking lock keys (some one key
// between them), runs whole on A, each task of B's share with it, rather
// than waiting for B.
func TestBusyOwnersPinnedAndLockedTasksRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 90
	release := make(chan struct{})
	defer close(release)
	var mu sync.Mutex
	ranOn := map[string]string{}
	run := func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Key == "hog" {
			return hold(ctx, t, release)
		}
		mu.Lock()
		ranOn[job.Task.Key] = job.WorkerID
		mu.Unlock()
		time.Sleep(5 * time.Millisecond) // a task's work
		return nil
	}
	small := func(c *consumer.Config) { c.HeapSize, c.PageSize = 20, 5 }
	b := e.worker("B", run, onStore(e.open()), concurrency(1), small)
	e.publish("hog", pinned("B"))
	e.waitState("hog", task.StateRunning)
	a := &countedCandidates{Store: e.open()}
	awaitPeersKnown(t, e.store.Now(), b, e.worker("A", run, onStore(a), concurrency(2), small))
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 10 { // a backlog in a moment: most of it is read by refills
		wg.Go(func() {
			for i := g; i < n; i += 10 {
				var opts []publishOpt
				switch i % 3 {
				case 1:
					opts = append(opts, pinned("A", "B"))
				case 2:
					k := fmt.Sprintf("dev:%d", i)
					if i%4 == 0 {
						k = "dev:shared"
					}
					opts = append(opts, lockKeys(k))
				}
				if _, _, err := task.Publish(context.Background(), e.store, params(fmt.Sprintf("t%02d", i), opts...)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	testutil.Eventually(t, waitLong, "every task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ranOn) == n
	})
	t.Logf("%d tasks in %s; A read %d candidate rows", n, time.Since(start), a.rows.Load())
	mu.Lock()
	defer mu.Unlock()
	for k, w := range ranOn {
		if w != "A" {
			t.Errorf("%s ran on %s, whose only slot is taken", k, w)
		}
	}
}
