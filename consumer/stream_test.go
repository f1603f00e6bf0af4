package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// faultyStore wraps a store so that every change stream dies after a few
// events, with fail's error; it records where each stream resumed from.
type faultyStore struct {
	task.Store
	after int
	fail  error
	mu    sync.Mutex
	opens []task.Token
}

func (f *faultyStore) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	f.mu.Lock()
	f.opens = append(f.opens, p.ResumeAfter)
	f.mu.Unlock()
	s, err := f.Store.Watch(ctx, p)
	if err != nil {
		return nil, err
	}
	return &faultyStream{ChangeStream: s, left: f.after, fail: f.fail}, nil
}

type faultyStream struct {
	task.ChangeStream
	left int
	fail error
}

func (s *faultyStream) Next(ctx context.Context) (task.Event, error) {
	if s.left == 0 {
		return task.Event{}, s.fail
	}
	s.left--
	return s.ChangeStream.Next(ctx)
}

// TestStreamErrorsResumeFromToken: a stream that keeps failing is reopened
// from its resume token, and no task is missed with the safety net off.
func TestStreamErrorsResumeFromToken(t *testing.T) {
	t.Parallel()
	testStreamFaults(t, errors.New("connection reset"), true)
}

// TestStreamHistoryLostRequeries: when history is lost the worker reopens
// from scratch and re-queries, and still runs every task.
func TestStreamHistoryLostRequeries(t *testing.T) {
	t.Parallel()
	testStreamFaults(t, fmt.Errorf("resume: %w", task.ErrHistoryLost), false)
}

func testStreamFaults(t *testing.T, fail error, wantResume bool) {
	e := setup(t)
	fs := &faultyStore{Store: e.store, after: 3, fail: fail}
	var ran atomic.Int32
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		ran.Add(1)
		return nil
	}, onStore(fs), func(c *consumer.Config) { c.SafetyNetInterval = time.Hour })
	const n = 20
	for i := range n {
		e.publish(fmt.Sprintf("t-%d", i), lease(100*time.Millisecond, 5*time.Second))
		time.Sleep(5 * time.Millisecond) // spread the writes over several streams: the test is about the reopens between them
	}
	for i := range n {
		e.waitState(fmt.Sprintf("t-%d", i), task.StateSucceeded)
	}
	if ran.Load() != n {
		for i := range n {
			if doc := e.get(fmt.Sprintf("t-%d", i)); len(doc.Attempts) != 1 {
				t.Logf("%s: %+v", doc.Key, doc.Attempts)
			}
		}
		t.Fatalf("%d handler runs, want %d", ran.Load(), n)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.opens) < 3 {
		t.Fatalf("stream opened %d times, want it reopened after failures", len(fs.opens))
	}
	resumed := 0
	for _, tok := range fs.opens[1:] {
		if tok != nil {
			resumed++
		}
	}
	if wantResume && resumed != len(fs.opens)-1 {
		t.Errorf("%d of %d reopens resumed from a token, want all", resumed, len(fs.opens)-1)
	}
	if !wantResume && resumed != 0 {
		t.Errorf("%d reopens after lost history used a token, want none", resumed)
	}
}
