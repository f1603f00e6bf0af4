package mongostore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// commandCounter counts the commands a client sends, by "name collection".
type commandCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *commandCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		coll, _ := e.Command.Lookup(e.CommandName).StringValueOK()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.counts[strings.TrimSpace(e.CommandName+" "+coll)]++
	}}
}

// take returns the counts so far and starts again from zero.
func (c *commandCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.counts
	c.counts = map[string]int{}
	return got
}

// TestRoundTripsPerTask counts the commands one task's lifecycle costs on
// MongoDB (publish, claim, finish; with and without a lock key) and prints
// the figures. The counts are of commands, not of time, so they hold on a
// busy machine; the bounds are those of docs/operations.md "Round trips".
//
//	go test -run TestRoundTripsPerTask -v ./task/mongostore
func TestRoundTripsPerTask(t *testing.T) {
	uri := testservers.MongoURI(t)
	for _, tc := range []struct {
		name     string
		lockKeys []string
		// bounds on task writes and reads per task while running
		maxWrites, maxReads float64
	}{
		{name: "plain", maxWrites: 2, maxReads: 0.5},
		// Plus the line's read before a key is taken (find lock_lines).
		{name: "lock-key", lockKeys: []string{"device:d1"}, maxWrites: 2, maxReads: 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter := &commandCounter{counts: map[string]int{}}
			db := freshDB()
			st := open(t, uri, mongostore.Config{Database: db, Monitor: counter.monitor()})
			watcher := open(t, uri, mongostore.Config{Database: db})
			const n = 200
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			counter.take()
			for i := range n {
				p := task.PublishParams{Key: fmt.Sprintf("rt-%d", i), Kind: "noop"}
				p.LockKeys = tc.lockKeys
				if _, _, err := task.Publish(ctx, st, p); err != nil {
					t.Fatal(err)
				}
			}
			published := counter.take()
			runAll(ctx, t, st, watcher, n)
			ran := counter.take()
			report(t, tc.name, n, published, ran)
			if w := perTask(published, n, "update tasks", "insert tasks"); w != 1 {
				t.Errorf("publish: %.2f task writes per task, want 1", w)
			}
			// A few more on a busy machine: a claim that loses a race tries
			// again.
			const slack = 0.1
			if w := perTask(ran, n, "update tasks"); w > tc.maxWrites+slack {
				t.Errorf("run: %.2f task writes per task, want at most %.0f (claim, finish)", w, tc.maxWrites)
			}
			if r := perTask(ran, n, "find tasks", "count tasks", "aggregate tasks"); r > tc.maxReads {
				t.Errorf("run: %.2f task reads per task, want at most %.1f", r, tc.maxReads)
			}
			if l := perTask(ran, n, "findAndModify locks", "update locks", "delete locks"); l > 2*float64(len(tc.lockKeys))+slack {
				t.Errorf("run: %.2f lock writes per task, want at most %d (take, free)", l, 2*len(tc.lockKeys))
			}
		})
	}
}

// runAll runs every published task with a noop handler on a consumer over
// st, and waits (reading through watcher, which is not counted) until all
// n have succeeded.
func runAll(ctx context.Context, t *testing.T, st, watcher task.Store, n int) {
	t.Helper()
	mux := consumer.NewMux()
	mux.RegisterFunc("noop", func(context.Context, *consumer.Job) error { return nil })
	c, err := consumer.New(consumer.Config{Store: st, Handler: mux, WorkerID: "rt", Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	for {
		done, err := watcher.List(ctx, task.ListQuery{State: task.StateSucceeded})
		if err != nil {
			t.Fatal(err)
		}
		if len(done) == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d succeeded before the deadline", len(done), n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func perTask(counts map[string]int, n int, names ...string) float64 {
	sum := 0
	for _, name := range names {
		sum += counts[name]
	}
	return float64(sum) / float64(n)
}

func report(t *testing.T, name string, n int, published, ran map[string]int) {
	for _, phase := range []struct {
		label  string
		counts map[string]int
	}{{"publish", published}, {"run", ran}} {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(phase.counts)) {
			parts = append(parts, fmt.Sprintf("%s=%.2f", k, float64(phase.counts[k])/float64(n)))
		}
		t.Logf("round trips per task (%s, %s, %d tasks): %s", name, phase.label, n, strings.Join(parts, " "))
	}
}
