package flow

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// stallingStore holds its first document write once armed until release
// is closed: a worker's record stuck behind a busy store.
type stallingStore struct {
	task.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *stallingStore) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Store.PutDocument(ctx, d)
}

// A record stalled in the store until its worker's lease lapsed leaves
// the flow waiting when the next holder reads it: the step runs again
// under the next attempt (at-least-once), however long after the first
// outcome's ended_at, which is taken before the write. The flow keeps
// one outcome, the first to land, and moves on from it.
func TestStalledRecordRunsTheStepAgainOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStore(t)
	if _, _, err := Publish(ctx, s, Spec{Key: "f", Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	doc, err := s.Get(ctx, StepKey("f", 1, 0, "a", false))
	if err != nil {
		t.Fatal(err)
	}
	slow := &stallingStore{Store: s, entered: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	var ran []int
	step := func(during func()) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			mu.Lock()
			ran = append(ran, job.Attempt)
			mu.Unlock()
			during()
			return job.SetResult(map[string]int{"attempt": job.Attempt})
		})
	}
	first := Middleware(MiddlewareConfig{Store: slow})(step(func() {}))
	firstDone := make(chan error, 1)
	slow.armed.Store(true)
	go func() { firstDone <- first.Handle(ctx, &consumer.Job{Task: doc, Attempt: 1}) }()
	select {
	case <-slow.entered:
	case <-ctx.Done():
		t.Fatal("attempt 1 never recorded its outcome")
	}

	// Attempt 2 is claimed well after attempt 1's outcome got its time,
	// and attempt 1's record lands while attempt 2 runs.
	const gap = 200 * time.Millisecond
	time.Sleep(gap) // store time passes: the test is about a record stamped before it landing after
	claimed := s.Now()
	second := Middleware(MiddlewareConfig{Store: s})(step(func() {
		close(slow.release)
		if err := <-firstDone; err != nil {
			t.Errorf("attempt 1: %v", err)
		}
	}))
	if err := second.Handle(ctx, &consumer.Job{Task: doc, Attempt: 2}); err != nil {
		t.Fatalf("attempt 2, its record refused: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 2 || ran[0] != 1 || ran[1] != 2 {
		t.Fatalf("attempts run %v, want [1 2]: attempt 2 read the flow before attempt 1's record landed", ran)
	}
	f := mustState(t, s, "f", StateRunning, 1)
	a := f.Progress[0].Do
	if a.State != RunSucceeded || a.Attempt != 1 || string(f.Params["a"]) != `{"attempt":1}` {
		t.Fatalf("step a %s, attempt %d recorded, result %s: want attempt 1's outcome, the first to land", a.State, a.Attempt, f.Params["a"])
	}
	if claimed.Sub(a.EndedAt) < gap {
		t.Fatalf("attempt 1 recorded as ended at %s, attempt 2 claimed at %s: want the record's time taken before its stalled write",
			a.EndedAt.Format(time.RFC3339Nano), claimed.Format(time.RFC3339Nano))
	}
	b, err := s.Get(ctx, f.Progress[1].Do.Task)
	if err != nil || f.Progress[1].Do.State != RunActive {
		t.Fatalf("step b %s, its task: %v", f.Progress[1].Do.State, err)
	}
	var env envelope
	if err := json.Unmarshal(b.Payload, &env); err != nil || string(env.Params["a"]) != `{"attempt":1}` {
		t.Fatalf("step b sees a's result %s (%v), want attempt 1's", env.Params["a"], err)
	}
}
