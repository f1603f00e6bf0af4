package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// conflictCounter counts claim conflicts across workers.
type conflictCounter struct{ n atomic.Int64 }

func (c *conflictCounter) Claimed(consumer.ClaimEvent)   {}
func (c *conflictCounter) ClaimConflict(string)          { c.n.Add(1) }
func (c *conflictCounter) Finished(consumer.FinishEvent) {}

// TestClaimsSpreadAcrossWorkers: three idle workers, each on its own handle
// of one store file as three processes would be, share tasks published one
// at a time with about one claim attempt per task (every idle worker
// racing for every task cost some two conflicts a task), and each runs a
// share of them.
func TestClaimsSpreadAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	ran := map[string]int{}
	conflicts := &conflictCounter{}
	h := func(ctx context.Context, job *consumer.Job) error {
		mu.Lock()
		ran[job.WorkerID]++
		mu.Unlock()
		return nil
	}
	fast := func(c *consumer.Config) {
		c.Observer = conflicts
		c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, 2*time.Second
	}
	for _, id := range []string{"A", "B", "C"} {
		e.worker(id, h, onStore(e.open()), fast)
	}
	time.Sleep(500 * time.Millisecond) // each has read the registry with the others in it
	const n = 90
	for i := range n {
		e.publish(fmt.Sprintf("s-%02d", i))
		time.Sleep(5 * time.Millisecond)
	}
	for i := range n {
		e.waitState(fmt.Sprintf("s-%02d", i), task.StateSucceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("runs per worker %v, %d claim conflicts for %d tasks", ran, conflicts.n.Load(), n)
	if c := conflicts.n.Load(); c > n/5 {
		t.Errorf("%d claim conflicts for %d tasks; want at most %d (about one claim attempt per task)", c, n, n/5)
	}
	for _, id := range []string{"A", "B", "C"} {
		if ran[id] < n/10 {
			t.Errorf("worker %s ran %d of %d tasks; want its share (at least %d)", id, ran[id], n, n/10)
		}
	}
}
