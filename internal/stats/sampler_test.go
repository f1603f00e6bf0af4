package stats_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/task"
)

// reads counts one recorder's reads for the queue sample: the minute
// buckets it reads and the queue statistics it asks for.
type reads struct {
	task.Store
	minute, queue atomic.Int64
}

func (r *reads) GetDocument(ctx context.Context, namespace, id string) (task.Document, error) {
	if namespace == stats.MinuteNamespace {
		r.minute.Add(1)
	}
	return r.Store.GetDocument(ctx, namespace, id)
}

func (r *reads) Stats(ctx context.Context) (task.Stats, error) {
	r.queue.Add(1)
	return r.Store.Stats(ctx)
}

// Six idle recorders on one store, the queue sample a duty of whichever
// holds an election: per minute the cluster reads the minute's bucket and
// the queue about once, not once per recorder, and every minute gets
// exactly one sample while the duty moves: the holder stopped after its
// minute's sample, the duty vacant for a flush, two recorders both
// believing they hold it for a minute.
func TestQueueSampledOncePerMinutePerCluster(t *testing.T) {
	s := open(t)
	if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: "waiting", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	const n = 6
	var holders [n]atomic.Bool
	counted := make([]*reads, n)
	recs := make([]*stats.Recorder, n)
	for i := range n {
		counted[i] = &reads{Store: s}
		r, err := stats.NewRecorder(stats.RecorderConfig{Store: counted[i], Every: time.Hour, Samples: holders[i].Load})
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = r
	}
	stopped := map[int]bool{}
	// All at once, as workers flush: two holders race for one sample.
	flushAll := func() {
		var wg sync.WaitGroup
		for i, r := range recs {
			if !stopped[i] {
				wg.Go(func() {
					if err := r.Flush(t.Context()); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
	}
	t0 := s.Now().Truncate(time.Minute)
	const minutes = 6
	holders[0].Store(true)
	for m := range minutes {
		switch m {
		case 2:
			// The holder sampled minute 1 and stops; the duty is vacant
			// for minute 2's first flush, then recorder 1's.
			if err := recs[0].Stop(t.Context()); err != nil {
				t.Fatal(err)
			}
			stopped[0] = true
			holders[0].Store(false)
		case 4:
			// A takeover across a pause: 1 and 2 both sample minute 4.
			holders[2].Store(true)
		case 5:
			holders[1].Store(false)
		}
		for f := range 3 {
			s.set(t0.Add(time.Duration(m)*time.Minute + time.Duration(5+20*f)*time.Second))
			if m == 2 && f == 1 {
				holders[1].Store(true)
			}
			flushAll()
		}
	}

	for m := range minutes {
		at := t0.Add(time.Duration(m) * time.Minute)
		doc, err := s.GetDocument(t.Context(), stats.MinuteNamespace, stats.Minute.BucketID(at))
		if err != nil {
			t.Fatalf("minute %d: %v", m, err)
		}
		// Idle recorders write a minute's bucket only to sample it.
		if doc.Version != 1 {
			t.Errorf("minute %d: bucket written %d times, want once (one sample)", m, doc.Version)
		}
	}
	for _, b := range read(t, s, stats.Minute, minutes).Buckets {
		if b.Queue == nil || b.Queue.Pending != 1 {
			t.Errorf("minute %s: queue sample %+v, want one with 1 pending", b.Start.Format("15:04"), b.Queue)
		}
	}
	var minuteReads, queueReads int64
	for i, c := range counted {
		minuteReads += c.minute.Load()
		queueReads += c.queue.Load()
		if i >= 3 && (c.minute.Load() > 0 || c.queue.Load() > 0) {
			t.Errorf("recorder %d never held the duty yet read %d minute buckets and the queue %d times, want none",
				i, c.minute.Load(), c.queue.Load())
		}
	}
	// Per sample: the look at the minute's bucket and the read before the
	// write; in minute 4 the second sampler's look, queue read, read
	// before its write and read again after its conflict.
	if max := int64(2*minutes + 3); minuteReads > max {
		t.Errorf("%d reads of minute buckets over %d minutes of %d recorders, want at most %d", minuteReads, minutes, n, max)
	}
	if max := int64(minutes + 1); queueReads > max {
		t.Errorf("%d queue reads over %d minutes, want at most %d", queueReads, minutes, max)
	}
}
