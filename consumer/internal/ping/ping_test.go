package ping_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/consumer/internal/ping"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

var errDown = errors.New("connection refused")

// fakeStore is an in-memory task.Store with just what a Lease uses: Get,
// Update with version compare-and-set, AcquireLocks, and a settable clock.
// It can be taken down (every call fails) and can count calls.
type fakeStore struct {
	task.Store // unused methods panic (nil interface)

	mu       sync.Mutex
	now      time.Time
	docs     map[string]*task.Task
	down     bool
	updates  int // Update calls, failed ones included
	failed   int // Update calls that failed because the store was down
	gets     int
	locks    []task.LockParams
	lockErr  error
	beforeUp func(t *task.Task) // runs (under mu) before an Update is checked
}

func newFakeStore() *fakeStore {
	return &fakeStore{now: t0, docs: map[string]*task.Task{}}
}

func (s *fakeStore) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *fakeStore) advance(d time.Duration) {
	s.mu.Lock()
	s.now = s.now.Add(d)
	s.mu.Unlock()
}

func (s *fakeStore) setDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

func (s *fakeStore) Get(_ context.Context, key string) (*task.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gets++
	if s.down {
		return nil, errDown
	}
	t, ok := s.docs[key]
	if !ok {
		return nil, task.ErrNotFound
	}
	return t.Clone(), nil
}

func (s *fakeStore) Update(_ context.Context, t *task.Task) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates++
	if s.down {
		s.failed++
		return errDown
	}
	if s.beforeUp != nil {
		fn := s.beforeUp
		s.beforeUp = nil
		fn(s.docs[t.Key])
	}
	cur, ok := s.docs[t.Key]
	if !ok {
		return task.ErrNotFound
	}
	if cur.Version != t.Version {
		return task.ErrConflict
	}
	t.Version++
	s.docs[t.Key] = t.Clone()
	return nil
}

func (s *fakeStore) AcquireLocks(_ context.Context, p task.LockParams) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errDown
	}
	s.locks = append(s.locks, p)
	return s.lockErr
}

// modify changes the stored document as another process would.
func (s *fakeStore) modify(key string, fn func(t *task.Task)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.docs[key].Clone()
	fn(t)
	t.Version++
	s.docs[key] = t
}

func (s *fakeStore) stored(key string) *task.Task {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.docs[key].Clone()
}

func (s *fakeStore) counts() (updates, failed, gets int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates, s.failed, s.gets
}

// setup publishes a task with edit applied and claims it as worker "w".
func setup(t *testing.T, edit func(p *task.PublishParams)) (*fakeStore, *ping.Renewer) {
	t.Helper()
	s := newFakeStore()
	p := task.PublishParams{Key: "k", Kind: "noop", Options: task.Options{PingInterval: 10 * time.Millisecond, WorkerTimeout: time.Minute}}
	if edit != nil {
		edit(&p)
	}
	doc, err := task.NewTask(p, s.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.docs[doc.Key] = doc.Clone()
	claimed, attempt, err := preempt.ClaimTask(doc, task.Holder{WorkerID: "w"}, s.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(t.Context(), claimed); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(tWriter{t}, nil))
	return s, ping.New(s, claimed, attempt, logger)
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func leaseUntil(t *testing.T, doc *task.Task) time.Time {
	t.Helper()
	i := doc.Entry(task.Holder{WorkerID: "w", Attempt: 1})
	if i < 0 {
		t.Fatalf("no entry for w/1 in %+v", doc.Attempts)
	}
	return doc.Attempts[i].LeaseUntil
}

func TestRenewExtendsInStoreTime(t *testing.T) {
	t.Parallel()
	s, l := setup(t, func(p *task.PublishParams) { p.LockKeys = []string{"device:1"} })
	s.advance(30 * time.Second)
	if err := l.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := t0.Add(30*time.Second + time.Minute)
	if got := leaseUntil(t, s.stored("k")); !got.Equal(want) {
		t.Errorf("stored lease_until = %s, want %s", got, want)
	}
	if got := leaseUntil(t, l.Doc()); !got.Equal(want) {
		t.Errorf("cached lease_until = %s, want %s", got, want)
	}
	if l.Doc().Version != s.stored("k").Version {
		t.Errorf("cached version %d, stored %d", l.Doc().Version, s.stored("k").Version)
	}
	s.mu.Lock()
	locks := s.locks
	s.mu.Unlock()
	if len(locks) != 1 || locks[0].Keys[0] != "device:1" || !locks[0].Until.Equal(want) || !locks[0].Now.Equal(t0.Add(30*time.Second)) ||
		locks[0].Holder != (task.Holder{TaskKey: "k", WorkerID: "w", Attempt: 1}) {
		t.Errorf("locks = %+v", locks)
	}
}

func TestRenewLockTakenIsLeaseLost(t *testing.T) {
	t.Parallel()
	s, l := setup(t, func(p *task.PublishParams) { p.LockKeys = []string{"device:1"} })
	s.lockErr = &task.LockedError{Key: "device:1"}
	if err := l.Renew(t.Context()); !errors.Is(err, task.ErrLeaseLost) || !errors.Is(err, task.ErrLocked) {
		t.Errorf("Renew = %v, want ErrLeaseLost and ErrLocked", err)
	}
}

func TestWriteRetriesOnConflict(t *testing.T) {
	t.Parallel()
	s, l := setup(t, nil)
	// Another process writes between our read and our write.
	s.beforeUp = func(cur *task.Task) {
		cur.Priority = 42
		cur.Version++
	}
	_, _, getsBefore := s.counts()
	err := l.Write(t.Context(), func(tk *task.Task) error { tk.Payload = []byte(`{"x":1}`); return nil })
	if err != nil {
		t.Fatal(err)
	}
	got := s.stored("k")
	if got.Priority != 42 || string(got.Payload) != `{"x":1}` {
		t.Errorf("stored priority %d payload %s: a write was lost", got.Priority, got.Payload)
	}
	if _, _, gets := s.counts(); gets != getsBefore+1 {
		t.Errorf("Write re-read %d times, want 1", gets-getsBefore)
	}
	if l.Doc().Version != got.Version {
		t.Errorf("cached version %d, stored %d", l.Doc().Version, got.Version)
	}
}

func TestWriteErrors(t *testing.T) {
	t.Parallel()
	t.Run("fn error stops without writing", func(t *testing.T) {
		s, l := setup(t, nil)
		boom := errors.New("boom")
		u, _, _ := s.counts()
		if err := l.Write(t.Context(), func(*task.Task) error { return boom }); !errors.Is(err, boom) {
			t.Errorf("Write = %v", err)
		}
		if u2, _, _ := s.counts(); u2 != u {
			t.Error("Write wrote after fn failed")
		}
	})
	t.Run("store down", func(t *testing.T) {
		s, l := setup(t, nil)
		s.setDown(true)
		if err := l.Write(t.Context(), func(*task.Task) error { return nil }); !errors.Is(err, errDown) {
			t.Errorf("Write = %v", err)
		}
	})
	t.Run("task deleted", func(t *testing.T) {
		s, l := setup(t, nil)
		s.mu.Lock()
		delete(s.docs, "k")
		s.mu.Unlock()
		if err := l.Renew(t.Context()); !errors.Is(err, task.ErrLeaseLost) {
			t.Errorf("Renew of a deleted task = %v, want ErrLeaseLost", err)
		}
	})
}

func TestObserve(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fn   func(tk *task.Task)
		want error
	}{
		{"fine", func(tk *task.Task) { tk.Priority = 3 }, nil},
		{"cancelled", func(tk *task.Task) { _ = tk.Cancel(t0) }, task.ErrCancelled},
		{"unpinned", func(tk *task.Task) { tk.SpecificWorkerIDs = []string{"other"} }, task.ErrUnpinned},
		{"entry gone", func(tk *task.Task) { tk.Attempts = nil }, task.ErrLeaseLost},
		{"entry finished", func(tk *task.Task) { tk.Attempts[0].State = task.AttemptExpired }, task.ErrLeaseLost},
		{"other attempt", func(tk *task.Task) { tk.Attempts[0].Attempt = 2 }, task.ErrLeaseLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, l := setup(t, nil)
			seen := l.Doc().Clone()
			tt.fn(seen)
			seen.Version++
			err := l.Observe(seen)
			if tt.want == nil {
				if err != nil {
					t.Errorf("Observe = %v, want nil", err)
				}
			} else if !errors.Is(err, tt.want) {
				t.Errorf("Observe = %v, want %v", err, tt.want)
			}
			if l.Doc().Version != seen.Version {
				t.Error("Observe did not keep the newer document")
			}
		})
	}
	t.Run("older document ignored", func(t *testing.T) {
		t.Parallel()
		_, l := setup(t, nil)
		old := l.Doc().Clone()
		old.Version--
		old.Priority = 99
		if err := l.Observe(old); err != nil {
			t.Errorf("Observe = %v", err)
		}
		if l.Doc().Priority == 99 {
			t.Error("an older document replaced the newer one")
		}
	})
}

// keep runs l.Keep in a goroutine and returns the channel of lost causes
// and a channel closed when Keep returns.
func keep(t *testing.T, ctx context.Context, l *ping.Renewer) (<-chan error, <-chan struct{}) {
	t.Helper()
	lost := make(chan error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Keep(ctx, func(cause error) { lost <- cause })
	}()
	return lost, done
}

func wait(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Keep did not return")
	}
}

func TestKeepRenewsUntilCtxDone(t *testing.T) {
	t.Parallel()
	s, l := setup(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	lost, done := keep(t, ctx, l)
	s.advance(10 * time.Second)
	want := t0.Add(10*time.Second + time.Minute)
	testutil.Eventually(t, 5*time.Second, "a renewal in store time", func() bool { return leaseUntil(t, s.stored("k")).Equal(want) })
	cancel()
	wait(t, done)
	select {
	case err := <-lost:
		t.Errorf("lost(%v) called on ctx cancel", err)
	default:
	}
}

func (s *fakeStore) updateCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates
}

// TestStartRenewsUntilStopped: Start renews as Keep does, and once stop
// returns no renewal runs any more.
func TestStartRenewsUntilStopped(t *testing.T) {
	t.Parallel()
	s, l := setup(t, nil)
	lost := make(chan error, 1)
	stop := l.Start(func(cause error) { lost <- cause })
	s.advance(10 * time.Second)
	want := t0.Add(10*time.Second + time.Minute)
	testutil.Eventually(t, 5*time.Second, "a renewal in store time", func() bool { return leaseUntil(t, s.stored("k")).Equal(want) })
	stop()
	n := s.updateCount()
	testutil.Consistently(t, 50*time.Millisecond, "no renewal over five ping intervals after stop returned", // the window is the point
		func() bool { return s.updateCount() == n })
	if len(lost) != 0 {
		t.Errorf("lost(%v) called on stop", <-lost)
	}
}

// TestStartStoppedBeforeFirstPing: a task shorter than the ping interval
// writes nothing and leaves no goroutine behind (goleak checks).
func TestStartStoppedBeforeFirstPing(t *testing.T) {
	t.Parallel()
	s, l := setup(t, func(p *task.PublishParams) { p.PingInterval, p.WorkerTimeout = time.Hour, 2*time.Hour })
	n := s.updateCount()
	stop := l.Start(func(error) { t.Error("lost called") })
	stop()
	if got := s.updateCount(); got != n {
		t.Errorf("%d store writes by a lease stopped before its first ping", got-n)
	}
}

func TestKeepLost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(tk *task.Task)
		want   error
	}{
		{"cancelled", func(tk *task.Task) { _ = tk.Cancel(t0) }, task.ErrCancelled},
		{"unpinned", func(tk *task.Task) { tk.SpecificWorkerIDs = []string{"other"} }, task.ErrUnpinned},
		{"preempted", func(tk *task.Task) {
			tk.Attempts[0].State, tk.Attempts[0].EndedAt = task.AttemptExpired, t0
			tk.Attempts = append(tk.Attempts, task.Attempt{WorkerID: "x", State: task.AttemptRunning, Attempt: 2, LeaseUntil: t0.Add(time.Hour)})
		}, task.ErrLeaseLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, l := setup(t, nil)
			lost, done := keep(t, t.Context(), l)
			s.modify("k", tt.change)
			var cause error
			select {
			case cause = <-lost:
			case <-time.After(5 * time.Second):
				t.Fatal("lost not called")
			}
			if !errors.Is(cause, tt.want) || !errors.Is(cause, task.ErrLeaseLost) {
				t.Errorf("lost(%v), want %v", cause, tt.want)
			}
			wait(t, done)
			if len(lost) != 0 {
				t.Error("lost called twice")
			}
			if errors.Is(tt.want, task.ErrUnpinned) {
				if i := s.stored("k").Entry(task.Holder{WorkerID: "w", Attempt: 1}); i >= 0 {
					t.Errorf("unpinned worker's entry still stored: %+v", s.stored("k").Attempts)
				}
			}
		})
	}
}

func TestKeepRidesOutStoreErrorsWithinLease(t *testing.T) {
	t.Parallel()
	s, l := setup(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lost, done := keep(t, ctx, l)
	s.setDown(true)
	testutil.Eventually(t, 5*time.Second, "several failed renewals", func() bool { _, failed, _ := s.counts(); return failed >= 4 })
	s.advance(50 * time.Second) // still inside the one-minute lease
	testutil.Eventually(t, 5*time.Second, "more failed renewals", func() bool { _, failed, _ := s.counts(); return failed >= 6 })
	select {
	case err := <-lost:
		t.Fatalf("lost(%v) while the lease was still ours", err)
	default:
	}
	s.setDown(false)
	want := t0.Add(50*time.Second + time.Minute)
	testutil.Eventually(t, 5*time.Second, "renewal after recovery", func() bool { return leaseUntil(t, s.stored("k")).Equal(want) })
	cancel()
	wait(t, done)
	if len(lost) != 0 {
		t.Errorf("lost(%v) called", <-lost)
	}
}

func TestKeepLostWhenStoreDownPastLease(t *testing.T) {
	t.Parallel()
	s, l := setup(t, nil)
	lost, done := keep(t, t.Context(), l)
	s.setDown(true)
	testutil.Eventually(t, 5*time.Second, "a failed renewal", func() bool { _, failed, _ := s.counts(); return failed >= 2 })
	s.advance(time.Minute) // the lease (t0+1m) has now passed
	var cause error
	select {
	case cause = <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("lost not called after the lease expired")
	}
	if !errors.Is(cause, task.ErrLeaseLost) || !errors.Is(cause, errDown) {
		t.Errorf("lost(%v), want ErrLeaseLost wrapping the store error", cause)
	}
	wait(t, done)
}
