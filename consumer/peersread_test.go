package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// countedRegistry counts a store's registry reads.
type countedRegistry struct {
	task.Store
	reads atomic.Int64
}

func (c *countedRegistry) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	c.reads.Add(1)
	return c.Store.Workers(ctx)
}

// TestRegistryReadLessOftenAmongManyWorkers: with 250 other live workers
// in the registry, a worker reads the registry every third heartbeat
// (W²-records-a-second reads would not scale), and its registration, as
// the heartbeats that do not read it report it, stays live throughout.
func TestRegistryReadLessOftenAmongManyWorkers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const others, beat = 250, 40 * time.Millisecond
	now := e.store.Now()
	for i := range others {
		w := task.WorkerInfo{ID: fmt.Sprintf("other-%d", i), Instance: "i", Host: "elsewhere", PID: 1,
			Heartbeat: now, Until: now.Add(time.Minute)}
		if err := e.store.RegisterWorker(ctx, task.RegisterParams{Worker: w, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	reg := &countedRegistry{Store: e.store}
	c := e.worker("W", func(context.Context, *consumer.Job) error { return nil }, onStore(reg),
		func(c *consumer.Config) { c.HeartbeatInterval, c.HeartbeatTimeout = beat, 25*beat })
	// The first read after a heartbeat learns the others; from then on
	// one heartbeat in three reads.
	testutil.Eventually(t, waitLong, "a first registry read", func() bool { r, ok := c.Registration(); return ok && r.Self != nil })
	from := reg.reads.Load()
	start := time.Now()
	testutil.Consistently(t, 60*beat, "the worker's own registration reported live between reads", func() bool {
		r, ok := c.Registration()
		switch {
		case !ok || r.Err != nil:
			t.Logf("registration: %+v, %v", r, ok)
		case r.Self == nil || !r.Self.Live(e.store.Now()):
			t.Logf("registration lapsed or missing: %+v", r.Self)
		default:
			return true
		}
		return false
	})
	reads := reg.reads.Load() - from
	beats := int64(time.Since(start) / beat)
	t.Logf("%d registry reads over about %d heartbeats", reads, beats)
	if reads < 5 || reads > beats/2 {
		t.Fatalf("%d registry reads over about %d heartbeats among %d workers; want about one in three", reads, beats, others+1)
	}
}
