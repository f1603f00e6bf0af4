package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
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
	stopped := false
	var r *Rollout
	testutil.EventuallyEvery(t, time.Minute, 20*time.Millisecond, "the rollout to end", func() bool {
		var err error
		if r, err = Get(ctx, st, "handover"); err != nil {
			t.Fatal(err)
		}
		if p := r.Progress(); !stopped && p.Total.Succeeded >= 10 {
			_ = drivers[0].Stop(ctx) // the first driver goes mid-rollout
			stopped = true
		}
		return r.State.Final()
	})
	if r.State != StateCompleted || r.Progress().Total.Succeeded != 40 {
		t.Fatalf("%s %+v", r.State, r.Progress().Total)
	}
	checkRate(t, allDispatches(r), rate.N, time.Duration(rate.Per))
	checkRuns(t, f, r)
}

// listCounter counts the listings of the rollouts' namespace.
type listCounter struct {
	task.Store
	lists atomic.Int64
}

func (s *listCounter) Documents(ctx context.Context, namespace string) ([]task.Document, error) {
	if namespace == Namespace {
		s.lists.Add(1)
	}
	return s.Store.Documents(ctx, namespace)
}

// While no rollout is active the holder lists the rollouts once per
// IdleEvery, not once per Every; a rollout created meanwhile still starts
// within about IdleEvery, is stepped every Every while it runs, and once
// it is over the holder is back to IdleEvery.
func TestDriverIdleListsRarelyAndStartsARolloutPromptly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := &listCounter{Store: openStore(t)}
	newFleet(t, st.Store, 1, nil, nil, time.Millisecond)
	const every, idleEvery = 20 * time.Millisecond, 400 * time.Millisecond
	d, err := NewDriver(DriverConfig{Store: st, WorkerID: "d1", Every: every, IdleEvery: idleEvery, Lease: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop(ctx) })

	idle := func(what string) {
		t.Helper()
		const spell = 2 * time.Second
		before := st.lists.Load()
		// At Every it would be 100; one more for a pass that began with
		// the spell.
		most := int64(spell/idleEvery) + 1
		testutil.Consistently(t, spell, fmt.Sprintf("%s: at most %d listings of the rollouts (one per IdleEvery %s)", what, most, idleEvery),
			func() bool { return st.lists.Load()-before <= most })
	}
	// The first pass comes with the election.
	testutil.Eventually(t, 5*time.Second, "the driver's first pass", func() bool { return st.lists.Load() > 0 })
	idle("no rollout")

	waves, _ := ParseWaves("100%")
	created := time.Now()
	if _, err := Create(ctx, st, "prompt", Spec{Command: "update", Devices: devices(4), Waves: waves}); err != nil {
		t.Fatal(err)
	}
	var r *Rollout
	testutil.Eventually(t, 10*time.Second, "the rollout's first wave", func() bool {
		r, err = Get(ctx, st, "prompt")
		return err == nil && len(r.Waves) > 0 && !r.Waves[0].StartedAt.IsZero()
	})
	// The idle look plus one step, with room for a loaded machine.
	if waited := time.Since(created); waited > idleEvery+time.Second {
		t.Errorf("first wave started %s after the rollout was created, want within IdleEvery %s and a step", waited, idleEvery)
	}
	testutil.Eventually(t, 30*time.Second, "the rollout completed", func() bool {
		r, err = Get(ctx, st, "prompt")
		return err == nil && r.State == StateCompleted
	})
	// The pass that saw it completed, then idle again: no store fact
	// tells a pass at IdleEvery from one at Every but their pace.
	time.Sleep(idleEvery)
	idle("the only rollout completed")
}

func TestDriverConfigIdleEvery(t *testing.T) {
	st := openStore(t)
	for _, c := range []struct {
		every, idle time.Duration
		wantErr     bool
	}{
		{0, 0, false},
		{time.Second, 0, false}, // IdleEvery defaults to at least Every
		{0, -time.Second, true},
		{time.Second, 500 * time.Millisecond, true},
	} {
		_, err := NewDriver(DriverConfig{Store: st, WorkerID: "d1", Every: c.every, IdleEvery: c.idle})
		if gotErr := err != nil; gotErr != c.wantErr || (gotErr && !errors.Is(err, task.ErrInvalid)) {
			t.Errorf("Every %s IdleEvery %s: err %v, want error %v (task.ErrInvalid)", c.every, c.idle, err, c.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "idle every") {
			t.Errorf("Every %s IdleEvery %s: error %q does not name idle every", c.every, c.idle, err)
		}
	}
}
