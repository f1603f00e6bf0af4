package mongostore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// updateCounter counts `update tasks` commands and their statements, by
// what each statement sets: state succeeded (a finish) or running (a claim
// or a lease renewal).
type updateCounter struct {
	mu                                        sync.Mutex
	commands, stmts, finishes, running, finds int
}

func (c *updateCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if coll, _ := e.Command.Lookup("find").StringValueOK(); coll == mongostore.TasksCollection {
			c.mu.Lock()
			c.finds++
			c.mu.Unlock()
		}
		if coll, _ := e.Command.Lookup("update").StringValueOK(); coll != mongostore.TasksCollection {
			return
		}
		stmts, err := e.Command.Lookup("updates").Array().Values()
		if err != nil {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.commands++
		c.stmts += len(stmts)
		for _, v := range stmts {
			state, _ := v.Document().Lookup("u", "$set", "state").StringValueOK()
			switch state {
			case string(task.StateSucceeded):
				c.finishes++
			case string(task.StateRunning):
				c.running++
			}
		}
	}}
}

func (c *updateCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commands, c.stmts, c.finishes, c.running, c.finds = 0, 0, 0, 0, 0
}

// TestRoundTripsConcurrent prints the `update tasks` commands per task when
// 64 tasks run at once in one consumer at concurrency 32, each holding its
// lease for 300 ms with a 50 ms ping interval (so about 6 renewals each).
// Concurrent Updates of one store go out as one bulk write, so commands
// per task fall below statements per task. The figures depend on timing;
// the assertions are on counts that do not: every task claimed once and
// finished once, and no more commands than statements.
//
//	go test -run TestRoundTripsConcurrent -v ./task/mongostore
func TestRoundTripsConcurrent(t *testing.T) {
	uri := testservers.MongoURI(t)
	counter := &updateCounter{}
	db := freshDB()
	st := open(t, uri, mongostore.Config{Database: db, Monitor: counter.monitor()})
	watcher := open(t, uri, mongostore.Config{Database: db})
	const n, concurrency = 64, 32
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		p := task.PublishParams{Key: fmt.Sprintf("rtc-%d", i), Kind: "hold"}
		p.PingInterval, p.WorkerTimeout = 50*time.Millisecond, 3*time.Second
		if _, _, err := task.Publish(ctx, st, p); err != nil {
			t.Fatal(err)
		}
	}
	counter.reset()
	mux := consumer.NewMux()
	mux.RegisterFunc("hold", func(ctx context.Context, _ *consumer.Job) error {
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	c, err := consumer.New(consumer.Config{Store: st, Handler: mux, WorkerID: "rtc", Concurrency: concurrency})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(ctx, t, watcher, n)
	if err := c.Stop(context.WithoutCancel(ctx)); err != nil {
		t.Error(err)
	}
	counter.mu.Lock()
	defer counter.mu.Unlock()
	stmts := counter.stmts
	t.Logf("%d tasks, concurrency %d, ping 50ms, hold 300ms: update commands/task=%.2f statements/task=%.2f "+
		"(finishes %.2f, claims+renewals %.2f) statements/command=%.2f find tasks/task=%.2f",
		n, concurrency, per(counter.commands, n), per(stmts, n), per(counter.finishes, n), per(counter.running, n),
		float64(stmts)/float64(max(counter.commands, 1)), per(counter.finds, n))
	if counter.finishes < n {
		t.Errorf("%d finish statements; want at least %d", counter.finishes, n)
	}
	if counter.running < n {
		t.Errorf("%d claim and renewal statements; want at least %d claims", counter.running, n)
	}
	if counter.commands > stmts {
		t.Errorf("%d update commands for %d statements", counter.commands, stmts)
	}
}

func per(x, n int) float64 { return float64(x) / float64(n) }

func waitSucceeded(ctx context.Context, t *testing.T, st task.Store, n int) {
	t.Helper()
	for {
		done, err := st.List(ctx, task.ListQuery{State: task.StateSucceeded, Limit: n})
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
