package singleton_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
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

// TestStandbyLooksInOneRead: on MongoDB, a process standing by on two
// leases another holds looks at both with one read a renewal period, not
// a failed take and a read for each; it still takes over within a renewal
// period of a graceful stop and within a lease of a crash.
func TestStandbyLooksInOneRead(t *testing.T) {
	t.Parallel()
	const lease, renew = time.Second, 200 * time.Millisecond
	uri := testservers.MongoURI(t)
	db := fmt.Sprintf("lp_standby_%d_%d", time.Now().UnixNano()%1e12, dbSeq.Add(1))
	// One journal a lease: each has one holder at a time.
	journals := map[string]*journal{"one": {t: t}, "two": {t: t}}
	for _, j := range journals {
		t.Cleanup(j.check)
	}
	openStore := func() (*mongostore.Store, *commandCounts) {
		counts := &commandCounts{n: map[string]int{}}
		return openMongo(t, uri, db, counts.monitor()), counts
	}
	newRunner := func(id, key string, s *mongostore.Store) *singleton.Runner {
		r, err := singleton.New(singleton.Config{Store: s, Key: key, HolderID: id, Lease: lease, Renew: renew, Run: journals[key].work(id)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop(context.Background()) })
		return r
	}
	sa, _ := openStore()
	a1, a2 := newRunner("a", "one", sa), newRunner("a", "two", sa)
	testutil.Eventually(t, 5*time.Second, "a runs both", func() bool { return a1.Running() && a2.Running() })
	sb, bCounts := openStore()
	b1, b2 := newRunner("b", "one", sb), newRunner("b", "two", sb)
	// b's first tries find a holding.
	testutil.Eventually(t, 5*time.Second, "b's first tries", func() bool { return bCounts.snapshot()["findAndModify"] >= 2 })

	before, start := bCounts.snapshot(), time.Now()
	testutil.Consistently(t, 2*time.Second, "a running alone", func() bool {
		return !b1.Running() && !b2.Running() && a1.Running() && a2.Running()
	})
	after, took := bCounts.snapshot(), time.Since(start)
	looks := int(took/renew) + 2
	if n := after["findAndModify"] - before["findAndModify"]; n > 0 {
		t.Errorf("the standby tried to take a held lease %d times in %s, want none: a read says it is held", n, took.Round(time.Millisecond))
	}
	total := 0
	for name, n := range after {
		total += n - before[name]
	}
	if total > looks {
		t.Errorf("the standby sent %d commands in %s for two leases (since it opened: %v), want at most %d: one read a renewal period (%s) for both",
			total, took.Round(time.Millisecond), after, looks, renew)
	}

	// A graceful stop releases: b, which reads first, takes over within a
	// renewal period.
	if err := a1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = testutil.EventuallyTook(t, lease, "b runs one after a stopped it", b1.Running)
	if took > renew+300*time.Millisecond {
		t.Errorf("takeover after a release took %s, want within %s", took, renew)
	}

	// A crash leaves the lease to run out: b takes over within a lease.
	if err := a2.Abandon(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = testutil.EventuallyTook(t, lease+time.Second, "b runs two after a crashed", b2.Running)
	if took > lease+renew/2+300*time.Millisecond {
		t.Errorf("takeover after a crash took %s, want within about a lease (%s)", took, lease)
	}
}
