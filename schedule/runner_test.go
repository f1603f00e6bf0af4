package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func openStore(t *testing.T, path string) task.Store {
	t.Helper()
	s, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func startRunner(t *testing.T, s task.Store, late time.Duration) *schedule.Runner {
	t.Helper()
	r, err := schedule.NewRunner(schedule.RunnerConfig{Store: s, Poll: 100 * time.Millisecond, Late: late})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(context.Background()) })
	return r
}

// slotsOf returns the slots published for name, in order.
func slotsOf(t *testing.T, s task.Store, name string) []time.Time {
	t.Helper()
	ts, err := s.List(t.Context(), task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, tk := range ts {
		if at, ok := schedule.SlotOf(name, tk.Key); ok {
			if tk.RunAt.Before(at) { // later when published late (catch-up)
				t.Errorf("task %s runs at %s, before its slot", tk.Key, tk.RunAt)
			}
			out = append(out, at)
		}
	}
	return out
}

// waitSlots waits until tick has at least n slots published, and returns
// them.
func waitSlots(t *testing.T, s task.Store, n int) []time.Time {
	t.Helper()
	var got []time.Time
	testutil.EventuallyEvery(t, 30*time.Second, 50*time.Millisecond, fmt.Sprintf("at least %d slots of tick", n), func() bool {
		got = slotsOf(t, s, "tick")
		return len(got) >= n
	})
	return got
}

// holes counts the slots missing between consecutive published ones.
func holes(slots []time.Time, every time.Duration) int {
	n := 0
	for i := 1; i < len(slots); i++ {
		n += int(slots[i].Sub(slots[i-1])/every) - 1
	}
	return n
}

func TestAPI(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := t.Context()
	sch := schedule.Schedule{Name: "nightly", Cron: "0 3 * * *", TZ: "Europe/Berlin", CatchUp: schedule.DefaultCatchUp,
		Template: schedule.Template{Kind: "noop", Payload: []byte(`{"a":1}`)}}
	added, err := schedule.Add(ctx, s, sch, false)
	if err != nil {
		t.Fatal(err)
	}
	if added.Since.IsZero() || added.CreatedAt.IsZero() {
		t.Errorf("Add did not stamp the schedule: %+v", added)
	}
	if _, err := schedule.Add(ctx, s, sch, false); !errors.Is(err, schedule.ErrExists) {
		t.Errorf("second Add = %v, want ErrExists", err)
	}
	if _, err := schedule.Add(ctx, s, schedule.Schedule{Name: "bad", Every: task.Duration(time.Millisecond)}, false); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("Add of an invalid schedule = %v, want ErrInvalid", err)
	}
	if p, err := schedule.Pause(ctx, s, "nightly"); err != nil || !p.Paused {
		t.Fatalf("Pause = %+v, %v", p, err)
	}
	list, err := schedule.List(ctx, s)
	if err != nil || len(list) != 1 || !list[0].Paused || list[0].Cron != "0 3 * * *" || list[0].NextSlot.UTC().Hour() > 2 {
		t.Fatalf("List = %+v, %v (want one paused schedule, next slot 03:00 Berlin)", list, err)
	}
	if r, err := schedule.Resume(ctx, s, "nightly"); err != nil || r.Paused || !r.Since.After(added.Since) {
		t.Fatalf("Resume = %+v, %v", r, err)
	}
	if err := schedule.Remove(ctx, s, "nightly"); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		schedule.Remove(ctx, s, "nightly"),
		func() error { _, err := schedule.Pause(ctx, s, "nightly"); return err }(),
		func() error { _, err := schedule.Get(ctx, s, "nightly"); return err }(),
	} {
		if !errors.Is(err, schedule.ErrNotFound) {
			t.Errorf("after Remove: %v, want ErrNotFound", err)
		}
	}
}

// TestRunnersShareSlots runs two runners on two handles of one store (as
// two processes would), on each backend: every second of the window is
// published once, a pause stops publishing and a resume restarts it.
func TestRunnersShareSlots(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "s.db")
		runnersShareSlots(t, openStore(t, path), openStore(t, path))
	})
	t.Run("mongodb", func(t *testing.T) {
		t.Parallel()
		uri := testservers.MongoURI(t)
		db := fmt.Sprintf("lp_sched_%d", time.Now().UnixNano()%1e12)
		s1, s2 := openMongo(t, uri, db), openMongo(t, uri, db)
		t.Cleanup(func() { s1.Database().Drop(context.Background()) })
		runnersShareSlots(t, s1, s2)
	})
}

func openMongo(t *testing.T, uri, db string) *mongostore.Store {
	t.Helper()
	s, err := mongostore.Open(t.Context(), uri, &mongostore.Config{Database: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// passCounter counts the passes of the runner reading through it (each
// begins by reading the schedules) and keeps the store time its first
// pass measured its window from.
type passCounter struct {
	task.Store
	passes atomic.Int64

	mu       sync.Mutex
	firstNow time.Time
}

func (s *passCounter) Documents(ctx context.Context, namespace string) ([]task.Document, error) {
	if namespace == schedule.Namespace {
		s.passes.Add(1)
	}
	return s.Store.Documents(ctx, namespace)
}

func (s *passCounter) Now() time.Time {
	now := s.Store.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.firstNow.IsZero() {
		s.firstNow = now
	}
	return now
}

// waitPasses waits until the runner has begun n passes, so has ended n-1.
func (s *passCounter) waitPasses(t *testing.T, n int64) {
	t.Helper()
	testutil.Eventually(t, time.Minute, fmt.Sprintf("the runner to begin %d passes", n), func() bool { return s.passes.Load() >= n })
}

func runnersShareSlots(t *testing.T, s1, s2 task.Store) {
	if _, err := schedule.Add(t.Context(), s1, schedule.Schedule{Name: "tick", Every: task.Duration(time.Second),
		CatchUp: schedule.CatchUp{Mode: schedule.CatchUpNone}, Template: schedule.Template{Kind: "noop"}}, false); err != nil {
		t.Fatal(err)
	}
	runners := []*passCounter{{Store: s1}, {Store: s2}}
	for _, r := range runners {
		startRunner(t, r, 0)
	}
	got := waitSlots(t, s1, 3)
	if holes(got, time.Second) != 0 {
		t.Fatalf("slots %v (want none missing)", got)
	}
	if _, err := schedule.Pause(t.Context(), s2, "tick"); err != nil {
		t.Fatal(err)
	}
	// A pass that read the schedules before the pause may still publish:
	// count once each runner has begun a pass after it, so has ended those
	// before (a runner's passes run one after another).
	for _, r := range runners {
		r.waitPasses(t, r.passes.Load()+1)
	}
	paused := len(slotsOf(t, s1, "tick"))
	testutil.Consistently(t, 1500*time.Millisecond, fmt.Sprintf("%d slots while paused", paused), // a slot and a half: the window is the point
		func() bool { return len(slotsOf(t, s1, "tick")) == paused })
	if _, err := schedule.Resume(t.Context(), s1, "tick"); err != nil {
		t.Fatal(err)
	}
	after := waitSlots(t, s1, paused+1)
	// Resume owes nothing from the pause: the hole is the paused time.
	if h := holes(after, time.Second); h < 1 {
		t.Errorf("resumed: no slot skipped for the pause: %v", after)
	}
}

// TestCatchUpAfterOutage stops every runner for longer than Late, then
// starts one: catch_up all:2 publishes exactly the latest two missed slots.
func TestCatchUpAfterOutage(t *testing.T) {
	// Not parallel: its outage is measured in wall time.
	s := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	if _, err := schedule.Add(t.Context(), s, schedule.Schedule{Name: "tick", Every: task.Duration(time.Second),
		CatchUp: schedule.CatchUp{Mode: schedule.CatchUpAll, N: 2}, Template: schedule.Template{Kind: "noop"}}, false); err != nil {
		t.Fatal(err)
	}
	const late = 500 * time.Millisecond
	r := startRunner(t, s, late)
	waitSlots(t, s, 2)
	if err := r.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // the outage, in wall time: what it misses is the point
	// Read after the outage: a publish and its cursor that Stop stopped
	// waiting for may still land in the store's next commit.
	before := slotsOf(t, s, "tick")
	restarted := &passCounter{Store: s}
	startRunner(t, restarted, late)
	restarted.waitPasses(t, 2)
	after := slotsOf(t, s, "tick")
	// Missed or on time is decided at the first pass's store time, which a
	// loaded machine can put well after the start.
	restarted.mu.Lock()
	restart := restarted.firstNow
	restarted.mu.Unlock()
	if len(before) == 0 || len(after) <= len(before) {
		t.Fatalf("slots before %v, after %v", before, after)
	}
	caught := after[len(before):]
	// Slots overdue by more than late at the restart were missed; of those
	// exactly the latest two ran, and everything after them.
	var missedRun int
	for _, at := range caught {
		if at.Before(restart.Add(-late)) {
			missedRun++
		}
	}
	if missedRun != 2 || holes(caught, time.Second) != 0 {
		t.Errorf("restart at %s: caught up %v (want the latest 2 missed, then none missing)", restart.Format(time.TimeOnly), caught)
	}
	if holes(after, time.Second) < 1 {
		t.Errorf("no slot of the outage was skipped: %v", after)
	}
}

// countingStore counts the inserts made through it.
type countingStore struct {
	task.Store
	inserts atomic.Int64
}

func (s *countingStore) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	s.inserts.Add(1)
	return s.Store.Insert(ctx, t)
}

// TestOneElectedRunnerPublishes: three runners with holder ids on three
// handles of one store (as three workers): one polls and publishes, the
// others insert nothing; when it stops, another takes over and no slot
// is missed. The runners poll every DefaultPoll, as workers do: their
// lease is three polls, and a holder whose renewal the store stalls past
// it hands over to another by design (a slot published twice is one
// task), which a loaded machine does to a 300 ms lease.
func TestOneElectedRunnerPublishes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	var stores [3]*countingStore
	var runners [3]*schedule.Runner
	for i := range stores {
		stores[i] = &countingStore{Store: openStore(t, path)}
	}
	if _, err := schedule.Add(t.Context(), stores[0], schedule.Schedule{Name: "tick", Every: task.Duration(time.Second),
		CatchUp: schedule.CatchUp{Mode: schedule.CatchUpNone}, Template: schedule.Template{Kind: "noop"}}, false); err != nil {
		t.Fatal(err)
	}
	for i := range runners {
		r, err := schedule.NewRunner(schedule.RunnerConfig{Store: stores[i], Poll: schedule.DefaultPoll, HolderID: fmt.Sprintf("w%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop(context.Background()) })
		runners[i] = r
	}
	published := func() bool {
		for _, s := range stores {
			if s.inserts.Load() > 0 {
				return true
			}
		}
		return false
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "a runner to publish", published)
	// Over the others' polls they must insert nothing.
	testutil.Consistently(t, 2500*time.Millisecond, "one runner alone publishing", func() bool {
		n := 0
		for _, s := range stores {
			if s.inserts.Load() > 0 {
				n++
			}
		}
		return n == 1
	})
	holder := -1
	for i, s := range stores {
		if n := s.inserts.Load(); n > 0 {
			if holder >= 0 {
				t.Fatalf("runners w%d and w%d both published (%d and %d inserts)", holder, i, stores[holder].inserts.Load(), n)
			}
			holder = i
		}
	}
	if err := runners[holder].Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := len(slotsOf(t, stores[0], "tick"))
	// A stopped holder releases the lease: another takes it within a poll
	// and publishes a slot a poll ahead. The bound: the lease (three
	// polls, for a release that did not land), two slots, and a second.
	var got []time.Time
	testutil.EventuallyEvery(t, 3*schedule.DefaultPoll+3*time.Second, 50*time.Millisecond, fmt.Sprintf("two slots more than %d after the holder stopped", before), func() bool {
		got = slotsOf(t, stores[0], "tick")
		return len(got) >= before+2
	})
	if holes(got, time.Second) != 0 {
		t.Fatalf("after the holder stopped: slots %v (want none missing)", got)
	}
	took := 0
	for i, s := range stores {
		if i != holder && s.inserts.Load() > 0 {
			took++
		}
	}
	if took != 1 {
		t.Errorf("%d runners published after the holder stopped; want one", took)
	}
}
