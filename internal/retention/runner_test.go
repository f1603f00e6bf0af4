package retention_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
)

// TestRunnerTakesOver runs two Runners on one SQLite file, each on its own
// handle as two processes would: the holder of the lease deletes old
// finished tasks; once it stops, the other deletes the next ones.
func TestRunnerTakesOver(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	open := func() task.Store {
		s, err := sqlitestore.Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	probe := open()
	runners := map[string]*retention.Runner{}
	for _, id := range []string{"a", "b"} {
		r, err := retention.NewRunner(retention.RunnerConfig{
			Config:   retention.Config{Store: open(), Logger: slog.New(slog.DiscardHandler)},
			WorkerID: id, Every: 50 * time.Millisecond, Lease: 600 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop(ctx) })
		runners[id] = r
	}
	oldAndNew := func(prefix string) {
		now := probe.Now()
		for i := range 3 {
			storetest.PutTask(t, probe, fmt.Sprintf("%s-old-%d", prefix, i), "k", task.StateSucceeded, now.Add(-25*time.Hour))
		}
		storetest.PutTask(t, probe, prefix+"-recent", "k", task.StateSucceeded, now.Add(-time.Hour))
	}
	gone := func(prefix string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, prefix+": old tasks to be deleted", func() bool {
			_, err := probe.Get(ctx, prefix+"-old-2")
			return errors.Is(err, task.ErrNotFound)
		})
		if _, err := probe.Get(ctx, prefix+"-recent"); err != nil {
			t.Errorf("%s: a task within the policy was deleted: %v", prefix, err)
		}
	}
	holder := func() string {
		t.Helper()
		now := probe.Now()
		err := probe.AcquireLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: []string{retention.LockKey},
			Holder: task.Holder{TaskKey: "probe", WorkerID: "probe"}, Now: now, Until: now.Add(time.Millisecond)})
		var locked *task.LockedError
		if !errors.As(err, &locked) {
			t.Fatalf("the retention lease is not held: %v", err)
		}
		return locked.Holder.WorkerID
	}

	oldAndNew("first")
	gone("first")
	first := holder()
	if err := runners[first].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	oldAndNew("second")
	gone("second")
	if second := holder(); second == first {
		t.Fatalf("%s still holds the retention lease after Stop", second)
	}
}

func TestRunnerConfig(t *testing.T) {
	s := &sqlitestore.Store{}
	for _, c := range []struct {
		cfg   retention.RunnerConfig
		field string
	}{
		{retention.RunnerConfig{WorkerID: "a"}, "store"},
		{retention.RunnerConfig{Config: retention.Config{Store: s}}, "worker id"},
		{retention.RunnerConfig{Config: retention.Config{Store: s}, WorkerID: "a", Every: -time.Second}, "every"},
		{retention.RunnerConfig{Config: retention.Config{Store: s}, WorkerID: "a", Lease: time.Millisecond}, "lease"},
	} {
		_, err := retention.NewRunner(c.cfg)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("NewRunner(%+v) = %v, want ErrInvalid naming %s", c.cfg, err, c.field)
		}
	}
}
