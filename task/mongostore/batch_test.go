package mongostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// gate holds the store's first batch in the updater, so that the Updates
// that follow queue up behind it and go out together when it is released
// (on a store of one update stream).
type gate struct {
	entered chan struct{}
	release chan struct{}
	sizes   []int // batch sizes after the first
	mu      sync.Mutex
}

func holdFirstBatch(st *mongostore.Store) *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	var first atomic.Bool
	mongostore.SetBeforeSend(st, func(n int) {
		if first.CompareAndSwap(false, true) {
			close(g.entered)
			<-g.release
			return
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		g.sizes = append(g.sizes, n)
	})
	return g
}

// start sends an Update of key (version 1, as inserted) that the gate holds.
func (g *gate) start(t *testing.T, st *mongostore.Store) <-chan error {
	t.Helper()
	tk := insertTask(t, st, "gate")
	done := make(chan error, 1)
	go func() { done <- st.Update(context.Background(), tk) }()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the gate's Update never reached the updater")
	}
	return done
}

func insertTask(t *testing.T, st task.Store, key string) *task.Task {
	t.Helper()
	tk, _, err := st.Insert(context.Background(), &task.Task{Key: key, Kind: "k", Payload: json.RawMessage(`{}`), RunAt: st.Now(), NextClaimAt: st.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return tk.Clone()
}

// waitQueued waits until n Updates wait behind the gate.
func waitQueued(t *testing.T, st *mongostore.Store, n int) {
	t.Helper()
	testutil.EventuallyEvery(t, 30*time.Second, time.Millisecond, fmt.Sprintf("%d Updates queued", n), func() bool { return mongostore.QueuedUpdates(st) >= n })
}

func mustGetTask(t *testing.T, st task.Store, key string) *task.Task {
	t.Helper()
	tk, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	return tk
}

// One batch holding two writers of one version, a stale version, a missing
// key and plain updates: each caller gets its own outcome, the batch is one
// `update` command, and resolving it one `find`.
func TestBatchOutcomes(t *testing.T) {
	t.Parallel()
	uri := testservers.MongoURI(t)
	counter := &updateCounter{}
	db := freshDB()
	st := open(t, uri, mongostore.Config{Database: db, Monitor: counter.monitor(), UpdateStreams: 1})
	other := open(t, uri, mongostore.Config{Database: db})
	g := holdFirstBatch(st)
	gateDone := g.start(t, st)

	dup1 := insertTask(t, st, "dup")
	dup2 := dup1.Clone()
	dup1.Priority, dup2.Priority = 1, 2
	stale := insertTask(t, st, "stale")
	if _, err := task.Modify(context.Background(), other, "stale", func(tk *task.Task) error {
		tk.Priority = 7
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stale.Priority = 99
	ghost := &task.Task{Key: "ghost", Kind: "k", Payload: json.RawMessage(`{}`), Version: 1, RunAt: st.Now(), NextClaimAt: st.Now()}
	var plain []*task.Task
	for _, key := range []string{"ok-0", "ok-1", "ok-2", "ok-3", "ok-4"} {
		tk := insertTask(t, st, key)
		tk.Priority = 10
		plain = append(plain, tk)
	}
	all := append([]*task.Task{dup1, dup2, stale, ghost}, plain...)
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, tk := range all {
		wg.Go(func() { errs[i] = st.Update(context.Background(), tk) })
	}
	waitQueued(t, st, len(all))
	stream, err := other.Watch(context.Background(), task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	counter.reset()
	close(g.release)
	wg.Wait()
	if err := <-gateDone; err != nil {
		t.Fatalf("gate Update: %v", err)
	}

	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two writers of one version: %v, %v; want exactly one nil", errs[0], errs[1])
	}
	winner, loser := dup1, errs[1]
	if errs[0] != nil {
		winner, loser = dup2, errs[0]
	}
	if !errors.Is(loser, task.ErrConflict) {
		t.Errorf("losing writer: %v; want ErrConflict", loser)
	}
	if got := mustGetTask(t, other, "dup"); got.Version != 2 || got.Priority != winner.Priority {
		t.Errorf("dup stored version %d priority %d; want 2, %d (the winner's)", got.Version, got.Priority, winner.Priority)
	}
	if !errors.Is(errs[2], task.ErrConflict) {
		t.Errorf("stale version: %v; want ErrConflict", errs[2])
	}
	if got := mustGetTask(t, other, "stale"); got.Version != 2 || got.Priority != 7 {
		t.Errorf("stale stored version %d priority %d; want 2, 7 (untouched)", got.Version, got.Priority)
	}
	if !errors.Is(errs[3], task.ErrNotFound) {
		t.Errorf("missing key: %v; want ErrNotFound", errs[3])
	}
	if _, err := other.Get(context.Background(), "ghost"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("Get of the missing key after the batch: %v; want ErrNotFound (nothing inserted)", err)
	}
	for i, tk := range plain {
		if errs[4+i] != nil || tk.Version != 2 {
			t.Errorf("%s: %v, version %d; want nil, 2", tk.Key, errs[4+i], tk.Version)
		}
		if got := mustGetTask(t, other, tk.Key); got.Version != 2 || got.Priority != 10 {
			t.Errorf("%s stored version %d priority %d; want 2, 10", tk.Key, got.Version, got.Priority)
		}
	}
	// Every statement of the bulk write is a change event of its own.
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(seen) < 1+len(plain) {
		ev, err := stream.Next(ctx)
		if err != nil {
			t.Fatalf("change events of the batch: saw %v: %v", seen, err)
		}
		if ev.Key == "dup" || strings.HasPrefix(ev.Key, "ok-") {
			seen[ev.Key] = true
		}
	}
	counter.mu.Lock()
	defer counter.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	// The gate's own updateOne, then one bulk write of every queued Update.
	if counter.commands != 2 || counter.stmts != 1+len(all) || len(g.sizes) != 1 || g.sizes[0] != len(all) {
		t.Errorf("%d update commands, %d statements, batches %v; want 2, %d, [%d]",
			counter.commands, counter.stmts, g.sizes, 1+len(all), len(all))
	}
	if counter.finds != 1 {
		t.Errorf("%d finds to resolve the batch; want 1", counter.finds)
	}
}

// An Update whose context ends while it waits in the queue is never sent.
func TestBatchCancelledWhileQueued(t *testing.T) {
	t.Parallel()
	st := open(t, testservers.MongoURI(t), mongostore.Config{Database: freshDB(), UpdateStreams: 1})
	g := holdFirstBatch(st)
	gateDone := g.start(t, st)
	tk := insertTask(t, st, "queued")
	tk.Priority = 5
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.Update(ctx, tk) }()
	waitQueued(t, st, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Update cancelled while queued: %v; want context.Canceled", err)
	}
	close(g.release)
	if err := <-gateDone; err != nil {
		t.Fatalf("gate Update: %v", err)
	}
	// The next Update goes out after the cancelled one was dropped.
	probe := insertTask(t, st, "probe")
	if err := st.Update(context.Background(), probe); err != nil {
		t.Fatal(err)
	}
	if got := mustGetTask(t, st, "queued"); got.Version != 1 || got.Priority != 0 {
		t.Errorf("cancelled Update applied: version %d priority %d; want 1, 0", got.Version, got.Priority)
	}
	if tk.Version != 1 {
		t.Errorf("cancelled Update changed t.Version to %d", tk.Version)
	}
}

// Close fails queued Updates with ErrClosed without waiting for them, and
// sends nothing more: neither the held batch nor the queued one applies.
func TestBatchClosedWhileQueued(t *testing.T) {
	t.Parallel()
	uri := testservers.MongoURI(t)
	db := freshDB()
	st := open(t, uri, mongostore.Config{Database: db, UpdateStreams: 1})
	other := open(t, uri, mongostore.Config{Database: db})
	g := holdFirstBatch(st)
	gateDone := g.start(t, st)
	tk := insertTask(t, st, "queued")
	done := make(chan error, 1)
	go func() { done <- st.Update(context.Background(), tk) }()
	waitQueued(t, st, 1)
	closed := make(chan error, 1)
	go func() { closed <- st.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, task.ErrClosed) {
			t.Fatalf("queued Update at Close: %v; want ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a queued Update hung at Close")
	}
	close(g.release)
	if err := <-gateDone; !errors.Is(err, task.ErrClosed) {
		t.Errorf("held Update at Close: %v; want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, key := range []string{"gate", "queued"} {
		if got := mustGetTask(t, other, key); got.Version != 1 {
			t.Errorf("%s: version %d after Close; want 1 (not sent)", key, got.Version)
		}
	}
	if err := st.Update(context.Background(), tk); !errors.Is(err, task.ErrClosed) {
		t.Errorf("Update after Close: %v; want ErrClosed", err)
	}
}
