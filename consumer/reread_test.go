package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

var errRereadFails = errors.New("re-read: connection reset")

// rereadFails wraps a store whose change events for one key come without
// their document, so the worker must re-read it, and whose reads of that
// key fail the first few times once armed. The stream resumes past an
// event whose re-read failed: only a query can still find that write.
type rereadFails struct {
	task.Store
	key string

	mu     sync.Mutex
	left   int         // reads of key still to fail
	failed []time.Time // when each failed read was answered
	opens  []task.Token
}

func (r *rereadFails) arm(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.left = n
}

func (r *rereadFails) failures() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.failed...)
}

func (r *rereadFails) Get(ctx context.Context, key string) (*task.Task, error) {
	if key == r.key {
		r.mu.Lock()
		fail := r.left > 0
		if fail {
			r.left--
			r.failed = append(r.failed, time.Now())
		}
		r.mu.Unlock()
		if fail {
			return nil, errRereadFails
		}
	}
	return r.Store.Get(ctx, key)
}

func (r *rereadFails) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	r.mu.Lock()
	r.opens = append(r.opens, p.ResumeAfter)
	r.mu.Unlock()
	s, err := r.Store.Watch(ctx, p)
	if err != nil {
		return nil, err
	}
	return &documentlessStream{ChangeStream: s, key: r.key}, nil
}

// documentlessStream drops the document from key's events, as a stream
// that could not carry it does.
type documentlessStream struct {
	task.ChangeStream
	key string
}

func (s *documentlessStream) Next(ctx context.Context) (task.Event, error) {
	ev, err := s.ChangeStream.Next(ctx)
	if err == nil && ev.Key == s.key {
		ev.Task = nil
	}
	return ev, err
}

// TestIdleRereadFails: a task published while the only worker is idle
// comes on an event without its document, and the worker's re-read of it
// fails twice. The stream resumes past that event, yet the task starts
// within seconds, not at the safety net an hour later: the failed re-read
// asks for a query.
func TestIdleRereadFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "reread"
	rs := &rereadFails{Store: e.store, key: key}
	starts := &idleStarts{}
	e.worker("W", starts.handler(nil), onStore(rs), idleCfg)
	warm(t, e.store, starts, "W")
	rs.mu.Lock()
	opened := len(rs.opens)
	rs.mu.Unlock()

	rs.arm(2)
	published := time.Now()
	e.publish(key)
	r := starts.await(t, key, 1, published.Add(idleSlack))
	t.Logf("%s started %s after its publish", key, r.at.Sub(published).Round(time.Millisecond))

	failed := rs.failures()
	if len(failed) == 0 || !failed[0].Before(r.at) {
		t.Fatalf("re-reads of %s failed at %v, want one before its start at %v: the test did not take the re-read path", key, failed, r.at)
	}
	e.waitState(key, task.StateSucceeded)
	var reopens []task.Token
	testutil.Eventually(t, waitLong, "the stream to reopen after the failed re-read", func() bool {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		reopens = rs.opens[opened:]
		return len(reopens) > 0
	})
	for i, tok := range reopens {
		if tok == nil {
			t.Fatalf("reopen %d after a failed re-read started over (no resume token), which queries anyway", i)
		}
	}
	if n := len(starts.of(key)); n != 1 {
		t.Fatalf("%s started %d times, want once", key, n)
	}
}
