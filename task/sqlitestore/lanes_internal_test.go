package sqlitestore

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// TestRenewalsOvertakeADocumentFlood: with the bulk lane full of document
// writes (device states, as thousands of devices connecting make them)
// and a couple of thousand callers blocked behind it, every lease renewal
// lands in the commit after the one in progress, before the lease it
// renews runs out, and the documents still go on being written, none
// lost. (Queued behind the flood, a renewal waits for every write ahead:
// 2,000 under the race detector take longer than the lease.) A plain
// build commits a renewal within about 40 ms; the race detector makes
// each commit some forty times slower, hence a bound in commits.
func TestRenewalsOvertakeADocumentFlood(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	const flooders = 2000
	ctx := task.WithInternalWrite(t.Context())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	written := make([]int64, flooders)
	var total atomic.Int64
	var floodErr atomic.Value
	for i := range flooders {
		wg.Go(func() {
			d := task.Document{Namespace: "test.flood", ID: fmt.Sprintf("dev-%d", i)}
			for n := 1; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				d.Value = json.RawMessage(fmt.Sprintf(`{"online":true,"n":%d}`, n))
				out, err := s.PutDocument(ctx, d)
				if err != nil {
					floodErr.CompareAndSwap(nil, err)
					return
				}
				d.Version = out.Version
				written[i] = out.Version
				total.Add(1)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	queued := func() int { return len(s.writeQ) + len(s.bulkQ) }
	testutil.Eventually(t, time.Minute, "a write queue full and every flooder writing", func() bool {
		return queued() >= maxBatch && total.Load() >= flooders
	})

	const (
		// The elector's and the broker host's: 3 s, renewed every second.
		lease  = 3 * time.Second
		renew  = time.Second
		rounds = 6
	)
	holder := task.Holder{TaskKey: "", WorkerID: "host", Instance: "i"}
	key := "mqtt-broker:127.0.0.1:1883"
	take := func() time.Time {
		now := s.Now()
		until := now.Add(lease)
		if err := s.AcquireLocks(t.Context(), task.LockParams{Namespace: task.LockSingleton, Keys: []string{key}, Holder: holder, Now: now, Until: until}); err != nil {
			t.Fatalf("renewal: %v", err)
		}
		return until
	}
	heldUntil := take()
	s.mainLag.Store(0)
	before := total.Load()
	tick := time.NewTicker(renew)
	defer tick.Stop()
	var slowest time.Duration
	for range rounds {
		<-tick.C
		sent, ends := time.Now(), heldUntil
		if sent.After(ends) {
			t.Fatalf("the lease ran out at %s before its renewal was sent", ends.Format(time.StampMilli))
		}
		heldUntil = take()
		if landed := time.Now(); landed.After(ends) {
			t.Fatalf("a renewal sent at %s landed at %s, after the lease it renewed ran out (%s)",
				sent.Format(time.StampMilli), landed.Format(time.StampMilli), ends.Format(time.StampMilli))
		}
		slowest = max(slowest, time.Since(sent))
		if q := queued(); q < maxBatch/2 {
			t.Fatalf("the flood thinned to %d queued: the test no longer floods", q)
		}
	}
	if lag := s.mainLag.Load(); lag > 2 {
		t.Errorf("a renewal waited for %d commits; want at most 2 (the one in progress, then its own)", lag)
	}
	during := total.Load() - before
	if during == 0 {
		t.Errorf("no document written during %d renewals: the bulk lane starved", rounds)
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	if err, _ := floodErr.Load().(error); err != nil {
		t.Fatalf("document write: %v", err)
	}
	for i, want := range written {
		d, err := s.GetDocument(t.Context(), "test.flood", fmt.Sprintf("dev-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if d.Version != want {
			t.Fatalf("dev-%d: version %d stored, %d written", i, d.Version, want)
		}
	}
	t.Logf("%d renewals, slowest %s, at most %d commits each; %d document writes meanwhile, %d in all",
		rounds, slowest, s.mainLag.Load(), during, total.Load())
}
