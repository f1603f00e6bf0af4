package rollout

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Two drivers on one store, the first stopped mid-rollout (giving up the
// lease if it held it): the other finishes the rollout, the rate kept.
func TestDriversTakeOverARollout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	f := newFleet(t, st, 2, nil, nil, 5*time.Millisecond)
	var drivers []*Driver
	for _, id := range []string{"d1", "d2"} {
		d, err := NewDriver(DriverConfig{Store: st, WorkerID: id, Every: 20 * time.Millisecond, Lease: time.Second,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Stop(ctx) })
		drivers = append(drivers, d)
	}
	rate := Rate{N: 5, Per: task.Duration(100 * time.Millisecond)}
	waves, _ := ParseWaves("10%,100%")
	if _, err := Create(ctx, st, "handover", Spec{Command: "update", Devices: devices(40), Waves: waves, Rate: rate}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	stopped := false
	for {
		r, err := Get(ctx, st, "handover")
		if err != nil {
			t.Fatal(err)
		}
		if p := r.Progress(); !stopped && p.Total.Succeeded >= 10 {
			_ = drivers[0].Stop(ctx)
			stopped = true
		}
		if r.State.Final() {
			if r.State != StateCompleted || r.Progress().Total.Succeeded != 40 {
				t.Fatalf("%s %+v", r.State, r.Progress().Total)
			}
			checkRate(t, allDispatches(r), rate.N, time.Duration(rate.Per))
			checkRuns(t, f, r)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout still %s: %+v", r.State, r.Progress().Total)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
