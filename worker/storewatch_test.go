package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

// registryCounter counts the registry reads that reach its store, and
// fails them once broken.
type registryCounter struct {
	task.Store
	reads  atomic.Int64
	broken atomic.Bool
}

var errRegistryDown = errors.New("registry down")

func (s *registryCounter) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	s.reads.Add(1)
	if s.broken.Load() {
		return nil, errRegistryDown
	}
	return s.Store.Workers(ctx)
}

// TestStoreFailTimeoutReadsNoRegistry: however short StoreFailTimeout (it
// looks every 100 ms here), watching the store adds no registry read to
// the heartbeat's one a second; and a registry that cannot be read is
// still reported on Failed, naming the read, once StoreFailTimeout has
// passed.
func TestStoreFailTimeoutReadsNoRegistry(t *testing.T) {
	t.Parallel()
	st := &registryCounter{Store: openStore(t)}
	w, err := worker.New(worker.Config{Store: st, ID: "probe", StoreFailTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())

	start, before := time.Now(), st.reads.Load()
	// One read a heartbeat (every second), and one more for a heartbeat
	// that straddles either end, at any time over two and a half.
	testutil.Consistently(t, 2500*time.Millisecond, "at most one registry read a heartbeat", func() bool {
		return st.reads.Load()-before <= int64(time.Since(start)/time.Second)+1
	})
	select {
	case err := <-w.Failed():
		t.Fatalf("Failed while the store works: %v", err)
	default:
	}

	st.broken.Store(true)
	select {
	case err := <-w.Failed():
		if !errors.Is(err, worker.ErrStoreFailing) || !errors.Is(err, errRegistryDown) ||
			!strings.Contains(err.Error(), "read the worker registry") {
			t.Errorf("Failed = %v, want ErrStoreFailing wrapping the registry read's error", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a registry that cannot be read went unreported for 15 s past a StoreFailTimeout of 1 s")
	}
}
