package tests

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
	"github.com/leasepool/leasepool/worker"
)

// TestRetentionOnWorkers lets two worker processes run retention every
// second under the default policy: exactly the finished tasks past their
// period go, in every state, and nothing pending, running or recent. Then
// the elected worker, which runs retention, is SIGKILLed and a backlog of
// more than one batch is added: the survivor is elected and deletes it.
func TestRetentionOnWorkers(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	now, day := store.Now(), 24*time.Hour
	// Kind "k": no worker here runs it, so nothing but retention touches them.
	deleted := map[string]bool{}
	put := func(key string, state task.State, age time.Duration, gone bool) {
		storetest.PutTask(t, store, key, "k", state, now.Add(-age))
		deleted[key] = gone
	}
	put("ok-25h", task.StateSucceeded, 25*time.Hour, true)
	put("ok-23h", task.StateSucceeded, 23*time.Hour, false)
	put("failed-8d", task.StateFailed, 8*day, true)
	put("failed-6d", task.StateFailed, 6*day, false)
	put("cancelled-25h", task.StateCancelled, 25*time.Hour, true)
	put("cancelled-1h", task.StateCancelled, time.Hour, false)
	put("pending-30d", task.StatePending, 30*day, false)
	put("running-30d", task.StateRunning, 30*day, false) // lease long over, still not finished
	put("running", task.StateRunning, 0, false)

	url := "sqlite:" + dbPath
	args := []string{"--kinds", "noop", "--retention-every", "1s"}
	workers := map[string]*workerProc{"w1": startWorker(t, url, "w1", args...), "w2": startWorker(t, url, "w2", args...)}
	defer func() {
		for _, w := range workers {
			w.kill(t)
		}
	}()
	exists := func(key string) bool {
		_, err := store.Get(ctx, key)
		if err != nil && !errors.Is(err, task.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	settled := func() bool {
		for key, gone := range deleted {
			if exists(key) == gone {
				return false
			}
		}
		return true
	}
	check := func(phase string) {
		t.Helper()
		for key, gone := range deleted {
			if exists(key) == gone {
				t.Errorf("%s: %s exists=%v, want deleted=%v", phase, key, !gone, gone)
			}
		}
	}
	eventually(t, 30*time.Second, "the old finished tasks to go", func() bool {
		return !exists("ok-25h") && !exists("failed-8d") && !exists("cancelled-25h")
	})
	// Over two more runs they must delete nothing more.
	if settled() {
		consistently(t, 2*time.Second, "the first runs' deletions, and no more", settled)
	}
	check("first runs")

	// The elected worker dies; the other is elected within the lease
	// (worker.ElectionLease).
	holder := electedHolder(t, store)
	survivor := map[string]string{"w1": "w2", "w2": "w1"}[holder]
	if survivor == "" {
		t.Fatalf("the election's lease held by %q, not a worker of this test", holder)
	}
	workers[holder].kill(t)
	delete(workers, holder)
	const backlog = retention.DefaultBatch + 20
	for i := range backlog {
		put(fmt.Sprintf("backlog-%03d", i), task.StateSucceeded, 2*day, true)
	}
	eventually(t, 30*time.Second, "the backlog to go after the holder's SIGKILL", func() bool {
		ts, err := store.List(ctx, task.ListQuery{State: task.StateSucceeded, Kind: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return len(ts) == 1 // ok-23h
	})
	if settled() {
		consistently(t, 2*time.Second, "the backlog's deletions, and no more", settled)
	}
	check("after the backlog")
	checkRetentionElected(t, store, survivor)
}

// electedHolder returns the worker id holding the election's lease.
func electedHolder(t *testing.T, store task.Store) string {
	t.Helper()
	holder, err := leaseHolder(t, store, worker.ElectionKey)
	if err != nil {
		t.Fatalf("the election's lease is not held: %v", err)
	}
	return holder
}

// leaseHolder returns the worker id holding the singleton lease key, or
// the error of a probe that found it free (and took it for a
// millisecond).
func leaseHolder(t *testing.T, store task.Store, key string) (string, error) {
	t.Helper()
	now := store.Now()
	err := store.AcquireLocks(t.Context(), task.LockParams{Namespace: task.LockSingleton, Keys: []string{key},
		Holder: task.Holder{TaskKey: "probe", WorkerID: "probe"}, Now: now, Until: now.Add(time.Millisecond)})
	var locked *task.LockedError
	if !errors.As(err, &locked) {
		return "", fmt.Errorf("not held: %v", err)
	}
	return locked.Holder.WorkerID, nil
}

// checkRetentionElected checks that retention ran as a duty of the
// elected worker, not as tasks: the survivor holds the election's lease
// in the lock table, and the store holds no built-in schedule's
// occurrence nor a task of retention's name.
func checkRetentionElected(t *testing.T, store task.Store, want string) {
	t.Helper()
	if got := electedHolder(t, store); got != want {
		t.Errorf("the election's lease held by %s, want %s", got, want)
	}
	ts, err := store.List(t.Context(), task.ListQuery{Reserved: true, Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range ts {
		if strings.HasPrefix(tk.Key, task.ReservedPrefix+"sched:") || tk.Kind == retention.LockKey {
			t.Errorf("task %s of kind %s in the store: retention publishes no tasks", tk.Key, tk.Kind)
		}
	}
}

// TestDeviceStateNamespaceAgrees checks that retention bounds the
// documents that mqttdev keeps device states in (retention does not
// import mqttdev).
func TestDeviceStateNamespaceAgrees(t *testing.T) {
	if retention.DeviceStateNamespace != mqttdev.StateNamespace {
		t.Fatalf("retention.DeviceStateNamespace %q, mqttdev.StateNamespace %q", retention.DeviceStateNamespace, mqttdev.StateNamespace)
	}
	store, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "store.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := mqttdev.StoreStates(store).PutDeviceState(t.Context(), mqttdev.DeviceState{ID: "pump-7", SeenAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	docs, err := store.Documents(t.Context(), retention.DeviceStateNamespace)
	if err != nil || len(docs) != 1 || docs[0].ID != "pump-7" {
		t.Errorf("Documents(%q) = %+v, %v: mqttdev keeps device states elsewhere", retention.DeviceStateNamespace, docs, err)
	}
}
