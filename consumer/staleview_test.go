package consumer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// staleRegistry is a store handle whose registry reads fail once stale is
// set: its worker keeps the last list of live workers it read.
type staleRegistry struct {
	task.Store
	stale atomic.Bool
}

func (s *staleRegistry) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	if s.stale.Load() {
		return nil, errors.New("registry read refused")
	}
	return s.Store.Workers(ctx)
}

// TestStaleRegistryViewRunsEveryTask: two live workers disagree for good
// on who is live (A keeps listing C, which died; B has dropped it), so the
// buckets C ranked first for that B gives to A are in neither's share as
// each sees it. A backlog still runs whole, those tasks with it, in about
// the time the two take for their shares.
func TestStaleRegistryViewRunsEveryTask(t *testing.T) {
	const n = 600
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{Latency: func(memstore.Op, string) time.Duration { return time.Millisecond }})
		a := &staleRegistry{Store: db.Open()}
		stores := map[string]task.Store{"A": a, "B": db.Open(), "C": db.Open()}
		var cs []*consumer.Consumer
		for _, id := range []string{"A", "B", "C"} {
			c, err := consumer.New(consumer.Config{Store: stores[id], WorkerID: id, Concurrency: 2, HeapSize: 50, PageSize: 10,
				Handler: consumer.HandlerFunc(func(context.Context, *consumer.Job) error { time.Sleep(10 * time.Millisecond); return nil }), // a task's work, in virtual time
				Logger:  slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		defer func() {
			for _, c := range cs[:2] {
				c.Stop(context.Background())
			}
		}()
		awaitPeersKnown(t, db.Open().Now(), cs...)
		synctest.Wait() // and has stored what it read
		ws, err := db.Open().Workers(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		byID := map[string]task.WorkerInfo{}
		for _, w := range ws {
			byID[w.ID] = w
		}
		shareA := preempt.NewPeers(ws, byID["A"], now).Share("A", nil)
		shareBAlone := preempt.NewPeers([]task.WorkerInfo{byID["A"], byID["B"]}, byID["B"], now).Share("B", nil)
		a.stale.Store(true)
		stores["C"].(*memstore.Store).Cut()
		cs[2].Stop(context.Background())
		// C's registration lapses (its unregister met the cut); B reads the
		// registry without it.
		cUntil := byID["C"].Until
		if ws, err := db.Open().Workers(t.Context()); err == nil {
			for _, w := range ws {
				if w.ID == "C" {
					cUntil = w.Until
				}
			}
		}
		awaitPeersKnown(t, cUntil, cs[1])
		synctest.Wait()
		publishN(t, db.Open(), "b", n)
		start := time.Now()
		r := &shareRun{db: db}
		r.waitSucceeded(t, n, time.Minute)
		took := time.Since(start)
		// Neither reads these in its share pass: A ranks C first, B ranks A
		// first.
		orphans := 0
		for _, tk := range r.db.Tasks() {
			b := task.ShareBucket(tk.Seq)
			if !slices.Contains(shareA, b) && !slices.Contains(shareBAlone, b) {
				orphans++
			}
		}
		t.Logf("%d tasks in %s, %d of them in no share as its worker sees it", n, took, orphans)
		if orphans < n/10 {
			t.Fatalf("%d of %d tasks in the buckets neither worker reads as its share; want about a third", orphans, n)
		}
		// Four slots at 10 ms a task take 1.5 s; twice that for the stand-bys
		// and the refills.
		if took > 3*time.Second {
			t.Errorf("the backlog took %s; want at most 3 s", took)
		}
	})
}
