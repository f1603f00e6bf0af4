package singleton_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task/mongostore"
)

// commandCounts counts the commands one store sends, by name.
type commandCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounts) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		c.n[e.CommandName]++
		c.mu.Unlock()
	}}
}

func (c *commandCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// TestStandbyLooksInOneRead: on MongoDB, a process standing by while
// another holds the lease looks at it with one read a renewal period,
// not a failed take and a read; it still takes over within a renewal
// period of a graceful stop and within a lease of a crash.
func TestStandbyLooksInOneRead(t *testing.T) {
	t.Parallel()
	const lease, renew = time.Second, 200 * time.Millisecond
	uri := testservers.MongoURI(t)
	db := fmt.Sprintf("lp_standby_%d_%d", time.Now().UnixNano()%1e12, dbSeq.Add(1))
	j := &journal{t: t}
	t.Cleanup(j.check)
	newRunner := func(id string) (*singleton.Runner, *commandCounts) {
		counts := &commandCounts{n: map[string]int{}}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := mongostore.Open(ctx, uri, &mongostore.Config{Database: db, Logger: slog.New(slog.DiscardHandler), Monitor: counts.monitor()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Database().Drop(ctx)
			s.Close()
		})
		r, err := singleton.New(singleton.Config{Store: s, Key: "test.standby", HolderID: id, Lease: lease, Renew: renew, Run: j.work(id)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop(context.Background()) })
		return r, counts
	}
	a, _ := newRunner("a")
	waitFor(t, 5*time.Second, "a runs", a.Running)
	b, bCounts := newRunner("b")
	time.Sleep(renew) // b's first try finds a holding

	before, start := bCounts.snapshot(), time.Now()
	time.Sleep(2 * time.Second)
	after, took := bCounts.snapshot(), time.Since(start)
	if b.Running() || !a.Running() {
		t.Fatalf("a running %v, b running %v: want a only", a.Running(), b.Running())
	}
	tries := int(took/renew) + 2
	if n := after["findAndModify"] - before["findAndModify"]; n > 0 {
		t.Errorf("the standby tried to take a held lease %d times in %s, want none: a read says it is held", n, took.Round(time.Millisecond))
	}
	total := 0
	for name, n := range after {
		total += n - before[name]
	}
	if total > tries {
		t.Errorf("the standby sent %d commands in %s (since it opened: %v), want at most %d: one read a renewal period (%s)",
			total, took.Round(time.Millisecond), after, tries, renew)
	}

	// A graceful stop releases: b, which reads first, takes over within a
	// renewal period.
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, lease, "b runs after a stopped", b.Running)
	if took > renew+300*time.Millisecond {
		t.Errorf("takeover after a release took %s, want within %s", took, renew)
	}

	// A crash leaves the lease to run out: c takes over within a lease.
	c, _ := newRunner("c")
	time.Sleep(renew)
	if err := b.Abandon(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, lease+time.Second, "c runs after b crashed", c.Running)
	if took > lease+renew/2+300*time.Millisecond {
		t.Errorf("takeover after a crash took %s, want within about a lease (%s)", took, lease)
	}
}
