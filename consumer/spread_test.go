package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// conflictCounter counts claim conflicts across workers.
type conflictCounter struct{ n atomic.Int64 }

func (c *conflictCounter) Claimed(consumer.ClaimEvent)   {}
func (c *conflictCounter) ClaimConflict(string)          { c.n.Add(1) }
func (c *conflictCounter) Finished(consumer.FinishEvent) {}

// spreadRun runs three idle workers, each on its own handle of one
// in-memory store (latency a call and a change event), on virtual time,
// while 90 tasks are published 5 ms apart; it returns the claim conflicts
// and the runs per worker.
func spreadRun(t *testing.T, spread, latency time.Duration) (int64, map[string]int) {
	const n = 90
	var conflicts conflictCounter
	ran := map[string]int{}
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{Latency: func(memstore.Op, string) time.Duration { return latency }})
		var mu sync.Mutex
		h := consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			mu.Lock()
			ran[job.WorkerID]++
			mu.Unlock()
			return nil
		})
		var cs []*consumer.Consumer
		for _, id := range []string{"A", "B", "C"} {
			c, err := consumer.New(consumer.Config{Store: db.Open(), Handler: h, WorkerID: id, Concurrency: 4,
				Observer: &conflicts, ClaimSpread: spread, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		if spread >= 0 { // spreading off reads no registry
			awaitPeersKnown(t, db.Open().Now(), cs...)
		}
		synctest.Wait() // and has stored what it read
		producer := db.Open()
		for i := range n {
			if _, _, err := task.Publish(t.Context(), producer, task.PublishParams{Key: fmt.Sprintf("s-%02d", i), Kind: "k"}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond) // one at a time, in virtual time: the test is about tasks published apart
		}
		(&shareRun{db: db}).waitSucceeded(t, n, time.Minute)
		for _, c := range cs {
			c.Stop(context.Background())
		}
	})
	return conflicts.n.Load(), ran
}

// TestClaimsSpreadAcrossWorkers: three idle workers share tasks published
// one at a time with about one claim attempt per task, each running its
// share; with spreading off every worker races for every task.
func TestClaimsSpreadAcrossWorkers(t *testing.T) {
	const n = 90
	conflicts, ran := spreadRun(t, 0, time.Millisecond)
	t.Logf("spread: runs per worker %v, %d claim conflicts for %d tasks", ran, conflicts, n)
	if conflicts > n/20 {
		t.Errorf("%d claim conflicts for %d tasks; want at most %d (about one claim attempt per task)", conflicts, n, n/20)
	}
	for _, id := range []string{"A", "B", "C"} {
		if ran[id] < n/6 {
			t.Errorf("worker %s ran %d of %d tasks; want its share (at least %d)", id, ran[id], n, n/6)
		}
	}
	racing, _ := spreadRun(t, -1, time.Millisecond)
	t.Logf("spreading off: %d claim conflicts for %d tasks", racing, n)
	if racing < n {
		t.Errorf("spreading off: %d claim conflicts for %d tasks; want every task raced for (at least %d)", racing, n, n)
	}
}

// TestClaimsSpreadOverSlowEvents: where a write and its change event take
// 15 ms each (a remote store), three times the 20 ms stand-by step would
// be over before the next rank hears the claim; the step follows the
// events' lag, so about one claim is still tried per task.
func TestClaimsSpreadOverSlowEvents(t *testing.T) {
	const n = 90
	conflicts, ran := spreadRun(t, 0, 15*time.Millisecond)
	t.Logf("15 ms events: runs per worker %v, %d claim conflicts for %d tasks", ran, conflicts, n)
	if conflicts > n/10 {
		t.Errorf("%d claim conflicts for %d tasks over 15 ms events; want at most %d", conflicts, n, n/10)
	}
}
