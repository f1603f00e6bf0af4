package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/storetest"
	"github.com/leasepool/leasepool/worker"
)

// sampleReads counts one worker's reads for the charts' queue sample.
type sampleReads struct {
	task.Store
	queue, minute atomic.Int64
}

func (s *sampleReads) Stats(ctx context.Context) (task.Stats, error) {
	s.queue.Add(1)
	return s.Store.Stats(ctx)
}

func (s *sampleReads) GetDocument(ctx context.Context, namespace, id string) (task.Document, error) {
	if namespace == stats.MinuteNamespace {
		s.minute.Add(1)
	}
	return s.Store.GetDocument(ctx, namespace, id)
}

// TestOneElectedWorkerSamplesTheQueue: of three idle workers on one
// store, one at a time is elected, and only it reads the queue and the
// minute's bucket for the charts' sample; the others read nothing for it.
// About 7 s: every worker's first flush comes 5 s after its start.
func TestOneElectedWorkerSamplesTheQueue(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	var ws []*worker.Worker
	var counted []*sampleReads
	for i := range 3 {
		c := &sampleReads{Store: st}
		w, err := worker.New(worker.Config{Store: c, ID: fmt.Sprintf("w%d", i), Kinds: []string{"noop"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Stop(context.Background()) })
		ws, counted = append(ws, w), append(counted, c)
	}
	started := time.Now()
	keeper := -1
	testutil.EventuallyEvery(t, 30*time.Second, 50*time.Millisecond, "an elected worker to sample the queue", func() bool {
		keeper = -1
		for i, w := range ws {
			if w.Elected() {
				if keeper >= 0 {
					t.Fatalf("workers %d and %d both elected", keeper, i)
				}
				keeper = i
			}
		}
		return keeper >= 0 && counted[keeper].queue.Load() > 0
	})
	// Every worker has flushed at least once by now. Another's flush
	// reads and writes nothing, which is the point: no fact shows it but
	// the time it comes at.
	time.Sleep(time.Until(started.Add(stats.DefaultEvery + time.Second)))
	for i, c := range counted {
		if i != keeper && (c.queue.Load() > 0 || c.minute.Load() > 0) {
			t.Errorf("worker %d, not elected, read the queue %d times and minute buckets %d times, want none",
				i, c.queue.Load(), c.minute.Load())
		}
	}
	if !ws[keeper].Elected() {
		t.Errorf("worker %d no longer elected in an idle cluster", keeper)
	}
}

// leaseHolder returns the worker id holding the lease on key in the
// singleton namespace, or "" when none does.
func leaseHolder(t *testing.T, st task.Store, key string) string {
	t.Helper()
	now := st.Now()
	probe := task.Holder{TaskKey: "probe", WorkerID: "probe"}
	err := st.AcquireLocks(t.Context(), task.LockParams{Namespace: task.LockSingleton, Keys: []string{key}, Holder: probe, Now: now, Until: now.Add(time.Millisecond)})
	var locked *task.LockedError
	switch {
	case errors.As(err, &locked):
		return locked.Holder.WorkerID
	case err != nil:
		t.Fatal(err)
	}
	if err := st.ReleaseLocks(t.Context(), task.LockParams{Namespace: task.LockSingleton, Keys: []string{key}, Holder: probe}); err != nil {
		t.Fatal(err)
	}
	return ""
}

// TestOneElectedWorkerRunsTheDuties: of three workers on one store, the
// one elected holds the one lease (ElectionKey) and runs the cluster's
// duties (retention deletes an old finished task); no duty holds a lease
// of its own. Stopped, it gives the lease up: another is elected within
// about a renewal period and runs the duties in its place.
func TestOneElectedWorkerRunsTheDuties(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ws := map[string]*worker.Worker{}
	for i := range 3 {
		id := fmt.Sprintf("w%d", i)
		w, err := worker.New(worker.Config{Store: st, ID: id, Kinds: []string{"noop"}, RetentionEvery: time.Second,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Stop(context.Background()) })
		ws[id] = w
	}
	// elected waits until exactly one worker, not not, says it is elected
	// and holds the lease, and returns it.
	elected := func(not string) string {
		t.Helper()
		var id string
		testutil.Eventually(t, 2*worker.ElectionLease, "one worker elected", func() bool {
			id = ""
			for wid, w := range ws {
				if w.Elected() {
					if id != "" {
						t.Fatalf("workers %s and %s both elected", id, wid)
					}
					id = wid
				}
			}
			return id != "" && id != not && leaseHolder(t, st, worker.ElectionKey) == id
		})
		return id
	}
	deleted := func(key string) {
		t.Helper()
		storetest.PutTask(t, st, key, "k", task.StateSucceeded, st.Now().Add(-48*time.Hour))
		testutil.Eventually(t, 10*time.Second, "retention to delete "+key, func() bool {
			_, err := st.Get(t.Context(), key)
			return errors.Is(err, task.ErrNotFound)
		})
	}

	first := elected("")
	deleted("old-1")
	for _, key := range []string{schedule.LockKey, retention.LockKey, rollout.LockKey, flow.ReconcileLockKey} {
		if h := leaseHolder(t, st, key); h != "" {
			t.Errorf("%s holds the lease %s: the duties run under the elector's lease alone", h, key)
		}
	}

	stopped := time.Now()
	if err := ws[first].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ws[first].Elected() {
		t.Errorf("%s still elected after Stop", first)
	}
	delete(ws, first)
	second := elected(first)
	if took := time.Since(stopped); took > worker.ElectionRenew+time.Second {
		t.Errorf("%s elected %s after %s stopped, want within about a renewal period (%s)", second, took, first, worker.ElectionRenew)
	}
	deleted("old-2")
}
