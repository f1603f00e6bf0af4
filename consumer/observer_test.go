package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// recorder is an Observer that keeps what it is told, claims by kind.
type recorder struct {
	mu        sync.Mutex
	claims    map[string][]consumer.ClaimEvent
	finishes  map[string][]consumer.FinishEvent
	conflicts int
}

func (r *recorder) Claimed(e consumer.ClaimEvent) {
	r.mu.Lock()
	r.claims[e.Kind] = append(r.claims[e.Kind], e)
	r.mu.Unlock()
}

func (r *recorder) ClaimConflict(string) {
	r.mu.Lock()
	r.conflicts++
	r.mu.Unlock()
}

func (r *recorder) Finished(e consumer.FinishEvent) {
	r.mu.Lock()
	r.finishes[e.Kind] = append(r.finishes[e.Kind], e)
	r.mu.Unlock()
}

func kind(k string) publishOpt { return func(p *task.PublishParams) { p.Kind = k } }

// TestObserverClaimWait checks ClaimEvent.Wait exactly against the stored
// claim: from created_at for a fresh task, from run_at for a delayed one,
// and from the end of the expired lease for one taken over from a dead
// holder (which the event counts); and one Finished per attempt with the
// outcome written.
func TestObserverClaimWait(t *testing.T) {
	e := setup(t)
	e.publish("fresh", kind("fresh"))
	e.publish("delayed", kind("delayed"), runAt(e.store.Now().Add(300*time.Millisecond)))
	e.publish("orphan", kind("orphan"))
	_, err := task.Modify(context.Background(), e.store, "orphan", func(doc *task.Task) error {
		doc.WorkerTimeout = task.Duration(200 * time.Millisecond)
		doc.Claim(task.Holder{TaskKey: "orphan", WorkerID: "dead", Instance: "gone"}, e.store.Now())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{claims: map[string][]consumer.ClaimEvent{}, finishes: map[string][]consumer.FinishEvent{}}
	e.worker("w1", func(context.Context, *consumer.Job) error { return nil }, func(c *consumer.Config) { c.Observer = rec })
	for _, k := range []string{"fresh", "delayed", "orphan"} {
		doc := e.waitState(k, task.StateSucceeded)
		claim := doc.Attempts[len(doc.Attempts)-1]
		ready, takenOver := doc.CreatedAt, 0
		switch k {
		case "delayed":
			ready = doc.RunAt
		case "orphan":
			ready, takenOver = doc.Attempts[0].LeaseUntil, 1
		}
		testutil.Eventually(t, waitLong, k+" finished", func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.finishes[k]) == 1
		})
		rec.mu.Lock()
		cs, fs := rec.claims[k], rec.finishes[k]
		rec.mu.Unlock()
		if len(cs) != 1 || cs[0].Wait != claim.StartedAt.Sub(ready) || cs[0].TakenOver != takenOver || cs[0].Attempt != claim.Attempt {
			t.Errorf("%s: claims %+v; want one, attempt %d, wait %s (claim at %s, ready at %s), taken over %d",
				k, cs, claim.Attempt, claim.StartedAt.Sub(ready), claim.StartedAt, ready, takenOver)
		}
		if f := fs[0]; f.Outcome != consumer.OutcomeSucceeded || !f.Started || f.Attempt != claim.Attempt {
			t.Errorf("%s: finished %+v, want succeeded, started, attempt %d", k, f, claim.Attempt)
		}
	}
}
