package mqttdev

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestStatusFloodLeavesRenewalsOnTime: three workers' trackers hear the
// same burst of status messages from a fleet connecting at once (every
// device online, offline, online again, as a device that reconnects) on
// one embedded store, while a worker renews a 3 s lease every second,
// as the broker's host and the elector do. Every renewal lands before the
// lease it renews runs out; every device's latest status is stored; and
// a status message every tracker heard is stored once, not once per
// tracker.
func TestStatusFloodLeavesRenewalsOnTime(t *testing.T) {
	st, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	const (
		devices  = 1500
		rounds   = 3
		trackers = 3
		lease    = 3 * time.Second
		renew    = time.Second
	)
	var trs []*StateTracker
	for range trackers {
		tr := NewStateTracker(StoreStates(st), nil)
		if err := tr.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer tr.Stop(context.Background())
		trs = append(trs, tr)
	}

	// The lease, renewed until the flood is stored.
	holder := task.Holder{TaskKey: "mqtt-broker:127.0.0.1:1883", WorkerID: "w0", Instance: "i"}
	take := func() (time.Time, error) {
		now := st.Now()
		until := now.Add(lease)
		return until, st.AcquireLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: []string{holder.TaskKey}, Holder: holder, Now: now, Until: until})
	}
	heldUntil, err := take()
	if err != nil {
		t.Fatal(err)
	}
	stored := make(chan struct{})
	renewals := make(chan error, 1)
	var renewed int
	var slowest time.Duration
	go func() {
		tick := time.NewTicker(renew)
		defer tick.Stop()
		for {
			select {
			case <-stored:
				renewals <- nil
				return
			case <-tick.C:
			}
			sent, ends := time.Now(), heldUntil
			until, err := take()
			if err == nil && time.Now().After(ends) {
				err = fmt.Errorf("a renewal sent at %s landed after the lease ran out at %s", sent.Format(time.StampMilli), ends.Format(time.StampMilli))
			}
			if err != nil {
				renewals <- err
				return
			}
			heldUntil, renewed, slowest = until, renewed+1, max(slowest, time.Since(sent))
		}
	}()

	base := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	status := func(r int) Status { return Status{Online: r%2 == 0, At: base.Add(time.Duration(r) * time.Second)} }
	observe := func(from, to int) {
		var wg sync.WaitGroup
		for _, tr := range trs {
			wg.Go(func() {
				for r := from; r < to; r++ {
					for i := range devices {
						tr.Observe(fmt.Sprintf("dev-%d", i), status(r), time.Now())
					}
				}
			})
		}
		wg.Wait()
	}
	versions := func() map[string]int64 {
		docs, err := st.Documents(ctx, StateNamespace)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, d := range docs {
			out[d.ID] = d.Version
		}
		return out
	}
	awaitStored := func(r int) {
		want := status(r)
		testutil.Eventually(t, 3*time.Minute, fmt.Sprintf("every device's status %d stored", r), func() bool {
			states, err := StoreStates(st).DeviceStates(ctx)
			if err != nil || len(states) != devices {
				return false
			}
			for _, s := range states {
				if !s.At.Equal(want.At) || s.Online != want.Online {
					return false
				}
			}
			return true
		})
	}
	observe(0, rounds)
	awaitStored(rounds - 1)
	// One more status per device, heard by every tracker: stored once.
	before := versions()
	observe(rounds, rounds+1)
	awaitStored(rounds)
	close(stored)
	if err := <-renewals; err != nil {
		t.Fatal(err)
	}
	var writes int64
	for id, v := range versions() {
		writes += v - before[id]
	}
	if writes != devices {
		t.Errorf("%d writes stored %d devices' status heard by %d trackers; want %d, one per device", writes, devices, trackers, devices)
	}
	t.Logf("%d devices x %d statuses heard by %d trackers, then one more: stored in %d writes; %d renewals, slowest %s",
		devices, rounds, trackers, writes, renewed, slowest)
}
