package mqttdev

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// listStore is a task.Store that answers List and Now only (and has no
// documents).
type listStore struct {
	task.Store
	now   time.Time
	tasks []*task.Task
}

func (s *listStore) Now() time.Time { return s.now }

func (s *listStore) Documents(context.Context, string) ([]task.Document, error) { return nil, nil }

func (s *listStore) List(_ context.Context, q task.ListQuery) ([]*task.Task, error) {
	var out []*task.Task
	for _, t := range s.tasks {
		if (q.State == "" || t.State == q.State) && (q.Kind == "" || t.Kind == q.Kind) && t.Seq > q.AfterSeq {
			out = append(out, t)
		}
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
	}
	return out, nil
}

type memStates struct {
	mu     sync.Mutex
	states []DeviceState
}

func (m *memStates) PutDeviceState(_ context.Context, s DeviceState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states = append(m.states, s)
	return nil
}

func (m *memStates) DeviceStates(context.Context) ([]DeviceState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.states), nil
}

func (m *memStates) len() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.states) }

func TestListDevices(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(seq int64, key, dev string, st task.State, workers ...task.Attempt) *task.Task {
		p, err := PublishParams(key, Command{Device: dev, Command: "cmd-" + key}, task.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return &task.Task{Key: key, Kind: p.Kind, Payload: p.Payload, Seq: seq, State: st, Attempts: workers}
	}
	s := &listStore{now: now, tasks: []*task.Task{
		mk(1, "a", "d1", task.StateRunning, task.Attempt{WorkerID: "w1", State: task.AttemptRunning, Attempt: 2, LeaseUntil: now.Add(time.Second)}),
		mk(2, "b", "d1", task.StatePending),
		mk(3, "c", "d1", task.StatePending),
		mk(4, "d", "d2", task.StatePending),
		mk(5, "e", "d3", task.StateSucceeded),
		{Key: "other", Kind: "exec", Seq: 6, State: task.StatePending},
	}}
	tr := NewStateTracker(nil, nil)
	tr.Observe("d1", Status{Online: true, At: now}, now)
	tr.Observe("d4", Status{Online: false, At: now}, now)
	got, err := ListDevices(context.Background(), s, tr)
	if err != nil {
		t.Fatal(err)
	}
	want := []DeviceInfo{
		{ID: "d1", Known: true, Online: true, At: now, Current: "a", Command: "cmd-a", Holder: "w1", Attempt: 2, Queued: 2, New: true},
		{ID: "d2", Queued: 1, New: true},
		{ID: "d4", Known: true, At: now, New: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ListDevices:\n got %+v\nwant %+v", got, want)
	}
}

func TestStateTrackerMirrorsToStore(t *testing.T) {
	t.Parallel()
	store := &memStates{}
	tr := NewStateTracker(store, nil)
	ctx := context.Background()
	if err := tr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	changed := tr.Changed("d1")
	tr.Observe("d1", Status{Online: true, At: time.Now()}, time.Now())
	<-changed
	tr.Observe("d1", Status{Online: false, At: time.Now()}, time.Now())
	if !tr.Offline("d1") || tr.Offline("unknown") {
		t.Fatal("Offline wrong")
	}
	testutil.Eventually(t, 5*time.Second, "the store write", func() bool {
		st, _ := store.DeviceStates(ctx)
		return len(st) > 0 && !st[len(st)-1].Online
	})
	if err := tr.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tr.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// A new tracker starts from the store.
	tr2 := NewStateTracker(store, nil)
	if err := tr2.Load(ctx); err != nil || !tr2.Offline("d1") || store.len() == 0 {
		t.Fatalf("Load: %v, offline %v", err, tr2.Offline("d1"))
	}
}

func TestReadStates(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{Count: 2}})
	e.sim.Device(1).GoOffline(time.Hour)
	testutil.Eventually(t, 10*time.Second, "the will", func() bool { return e.handler.Tracker().Offline(e.dev(1)) })
	tr, err := ReadStates(ctxT(t, 10*time.Second), ClientConfig{BrokerURL: e.url}, e.prefix, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	st := tr.States()
	if len(st) != 2 || !st[0].Online || st[1].Online {
		t.Fatalf("states %+v", st)
	}
}
