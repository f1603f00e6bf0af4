package stats_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// clocked is a real store whose Now the test sets.
type clocked struct {
	task.Store
	now atomic.Int64
	// putErr, when set, is returned by PutDocument: after writing when
	// landed is set (the write landed, the caller is told it failed),
	// instead of writing otherwise.
	putErr atomic.Pointer[error]
	landed atomic.Bool
}

func (c *clocked) Now() time.Time { return time.Unix(0, c.now.Load()).UTC() }

func (c *clocked) set(t time.Time) { c.now.Store(t.UnixNano()) }

func (c *clocked) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	if p := c.putErr.Load(); p != nil {
		if c.landed.Load() {
			if _, err := c.Store.PutDocument(ctx, d); err != nil {
				return task.Document{}, err
			}
		}
		return task.Document{}, *p
	}
	return c.Store.PutDocument(ctx, d)
}

func open(t *testing.T) *clocked {
	t.Helper()
	s, err := store.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "s.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := &clocked{Store: s}
	c.set(time.Date(2026, 11, 26, 10, 0, 30, 0, time.UTC))
	return c
}

func recorder(t *testing.T, s task.Store) *stats.Recorder {
	t.Helper()
	r, err := stats.NewRecorder(stats.RecorderConfig{Store: s, Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func finish(r *stats.Recorder, kind string, o consumer.Outcome) {
	r.Finished(consumer.FinishEvent{Kind: kind, Outcome: o, Started: true})
}

func read(t *testing.T, s task.Store, res stats.Resolution, n int) stats.Series {
	t.Helper()
	series, err := stats.Read(t.Context(), s, res, s.Now(), n)
	if err != nil {
		t.Fatal(err)
	}
	return series
}

// Two recorders counting from many goroutines and flushing at the same
// time, each flush a compare-and-set on the same buckets: not one count
// lost or doubled.
func TestTwoRecordersMergeExactly(t *testing.T) { mergeExactly(t, open(t)) }

// The same on the MongoDB wire test server.
func TestTwoRecordersMergeExactlyMongo(t *testing.T) {
	uri := testservers.MongoURI(t)
	m, err := mongostore.Open(t.Context(), uri, &mongostore.Config{Database: "stats_" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Database().Drop(context.Background())
		m.Close()
	})
	s := &clocked{Store: m}
	s.set(time.Date(2026, 11, 26, 10, 0, 30, 0, time.UTC))
	mergeExactly(t, s)
}

func mergeExactly(t *testing.T, s *clocked) {
	recs := []*stats.Recorder{recorder(t, s), recorder(t, s)}
	const perGoroutine = 300
	var wg sync.WaitGroup
	for _, r := range recs {
		for g := range 4 {
			wg.Go(func() {
				for i := range perGoroutine {
					switch {
					case i%10 == 0:
						finish(r, "flash", consumer.OutcomeFailed)
					case i%10 == 1:
						finish(r, "flash", consumer.OutcomeRetried)
					default:
						finish(r, "report-"+strconv.Itoa(g%2), consumer.OutcomeSucceeded)
					}
					if i%50 == 0 {
						if err := r.Flush(t.Context()); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
		wg.Go(func() { r.Claimed(consumer.ClaimEvent{Kind: "flash", TakenOver: 2}) })
		wg.Go(func() { finish(r, "flash", consumer.OutcomeLeaseLost) }) // nothing written: not counted
	}
	wg.Wait()
	for _, r := range recs {
		if err := r.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, res := range []stats.Resolution{stats.Minute, stats.Quarter} {
		series := read(t, s, res, 4)
		want := map[string]stats.Counts{
			"flash":    {Failed: 2 * 4 * 30, Retried: 2 * 4 * 30, Expired: 4},
			"report-0": {Succeeded: 2 * 2 * 240},
			"report-1": {Succeeded: 2 * 2 * 240},
		}
		for kind, c := range want {
			if got := series.Sum(kind); got != c {
				t.Errorf("%s %s: %+v, want %+v", res.Namespace, kind, got, c)
			}
		}
		last := series.Buckets[len(series.Buckets)-1]
		if got := last.Sum().Total(); got != 2*4*perGoroutine+4 {
			t.Errorf("%s: the current bucket counts %d, want %d", res.Namespace, got, 2*4*perGoroutine+4)
		}
		if last.Queue == nil {
			t.Errorf("%s: no queue sample", res.Namespace)
		}
	}
}

// Events land in the bucket of the store time they were counted at, and
// Read fills the steps without a document with zeros.
func TestBucketsByStoreTime(t *testing.T) {
	s := open(t)
	r := recorder(t, s)
	t0 := s.Now()
	finish(r, "a", consumer.OutcomeSucceeded)
	s.set(t0.Add(2 * time.Minute))
	finish(r, "a", consumer.OutcomeSucceeded)
	finish(r, "a", consumer.OutcomeFailed)
	s.set(t0.Add(16 * time.Minute))
	finish(r, "b", consumer.OutcomeCancelled)
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	m := read(t, s, stats.Minute, 20)
	if len(m.Buckets) != 20 || m.Step != time.Minute {
		t.Fatalf("%d buckets of %s, want 20 of 1m", len(m.Buckets), m.Step)
	}
	start := t0.Truncate(time.Minute)
	for i, want := range map[int]stats.Counts{0: {}, 2: {}, 3: {Succeeded: 1}, 4: {}, 5: {Succeeded: 1, Failed: 1}, 18: {}, 19: {}} {
		b := m.Buckets[i]
		if !b.Start.Equal(start.Add(time.Duration(i-3) * time.Minute)) {
			t.Errorf("bucket %d starts %s", i, b.Start)
		}
		if got := b.Kinds["a"]; got != want {
			t.Errorf("bucket %d (%s): a %+v, want %+v", i, b.Start, got, want)
		}
	}
	if got := m.Buckets[19].Kinds["b"]; got != (stats.Counts{Cancelled: 1}) {
		t.Errorf("minute of b: %+v", got)
	}
	q := read(t, s, stats.Quarter, 2)
	if got := q.Buckets[0].Kinds["a"]; got != (stats.Counts{Succeeded: 2, Failed: 1}) {
		t.Errorf("first quarter: %+v", got)
	}
	if got := q.Buckets[1].Kinds["b"]; got != (stats.Counts{Cancelled: 1}) {
		t.Errorf("second quarter: %+v", got)
	}
	if m.Kinds[0] != "a" || m.Kinds[1] != "b" {
		t.Errorf("kinds %q, want a (3) before b (1)", m.Kinds)
	}
}

// A write that failed is written at the next flush; one that landed
// although the store said it failed is not written twice.
func TestFailedWritesNeitherLostNorDoubled(t *testing.T) {
	s := open(t)
	r := recorder(t, s)
	broken := errors.New("connection reset")
	for _, landed := range []bool{false, true} {
		finish(r, "k", consumer.OutcomeSucceeded)
		s.landed.Store(landed)
		s.putErr.Store(&broken)
		if err := r.Flush(t.Context()); !errors.Is(err, broken) {
			t.Fatalf("flush with a broken store: %v", err)
		}
		s.putErr.Store(nil)
		finish(r, "k", consumer.OutcomeSucceeded)
		if err := r.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(t, s, stats.Minute, 1).Sum("k").Succeeded; got != 4 {
		t.Errorf("succeeded %d, want 4", got)
	}
	if got := read(t, s, stats.Quarter, 1).Sum("k").Succeeded; got != 4 {
		t.Errorf("quarter: succeeded %d, want 4", got)
	}
}

// A flood of distinct kinds cannot grow a bucket without bound: past
// MaxKinds they are counted together under OtherKinds.
func TestKindsBounded(t *testing.T) {
	s := open(t)
	r := recorder(t, s)
	for i := range stats.MaxKinds + 50 {
		finish(r, "k"+strconv.Itoa(i), consumer.OutcomeSucceeded)
	}
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	b := read(t, s, stats.Minute, 1).Buckets[0]
	if len(b.Kinds) != stats.MaxKinds+1 || b.Kinds[stats.OtherKinds].Succeeded != 50 {
		t.Errorf("%d kinds, other %+v; want %d and 50", len(b.Kinds), b.Kinds[stats.OtherKinds], stats.MaxKinds+1)
	}
	if got := b.Sum().Succeeded; got != stats.MaxKinds+50 {
		t.Errorf("sum %d", got)
	}
}

// The queue is sampled once per minute however many recorders flush, and
// old buckets are dropped.
func TestQueueSampleAndPrune(t *testing.T) {
	s := open(t)
	for i := range 3 {
		if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: "q" + strconv.Itoa(i), Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := s.Now()
	a, b := recorder(t, s), recorder(t, s)
	// An old bucket, past both resolutions' Keep.
	old := t0.Add(-30 * time.Hour)
	for _, res := range []stats.Resolution{stats.Minute, stats.Quarter} {
		v, _ := json.Marshal(stats.Bucket{Start: old.Truncate(res.Step)})
		if _, err := s.PutDocument(task.WithInternalWrite(t.Context()), task.Document{Namespace: res.Namespace, ID: res.BucketID(old), Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*stats.Recorder{a, b, a} {
		if err := r.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	doc, err := s.GetDocument(t.Context(), stats.MinuteNamespace, stats.Minute.BucketID(t0))
	if err != nil {
		t.Fatal(err)
	}
	if doc.Version != 1 {
		t.Errorf("the minute's bucket was written %d times, want once (one sample)", doc.Version)
	}
	q := read(t, s, stats.Minute, 1).Buckets[0].Queue
	if q == nil || q.Pending != 3 {
		t.Fatalf("queue sample %+v, want 3 pending", q)
	}
	for _, res := range []stats.Resolution{stats.Minute, stats.Quarter} {
		if _, err := s.GetDocument(t.Context(), res.Namespace, res.BucketID(old)); !errors.Is(err, task.ErrNotFound) {
			t.Errorf("%s: the old bucket: %v, want it pruned", res.Namespace, err)
		}
	}
	// The next minute gets its own sample.
	s.set(t0.Add(time.Minute))
	if err := b.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := read(t, s, stats.Minute, 2); got.Buckets[1].Queue == nil || got.Buckets[0].Queue == nil {
		t.Errorf("queue samples %+v %+v, want both minutes", got.Buckets[0].Queue, got.Buckets[1].Queue)
	}
}

func TestConfigRefused(t *testing.T) {
	if _, err := stats.NewRecorder(stats.RecorderConfig{}); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("no store: %v", err)
	}
	s := open(t)
	if _, err := stats.NewRecorder(stats.RecorderConfig{Store: s, Every: -time.Second}); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("negative Every: %v", err)
	}
	if _, err := stats.Read(t.Context(), s, stats.Minute, s.Now(), 0); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("0 buckets: %v", err)
	}
}
