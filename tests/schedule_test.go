package tests

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestScheduleEverySecondUnderKills runs a schedule every second for about
// 30 s on three worker processes, SIGKILLing them one after another (and
// restarting one), and checks that every slot of the window became exactly
// one task that succeeded exactly once: no slot missing, none twice.
func TestScheduleEverySecondUnderKills(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sch := schedule.Schedule{
		Name: "tick", Every: task.Duration(time.Second), CatchUp: schedule.CatchUp{Mode: schedule.CatchUpNone},
		// Each run takes 2.5 s, so a kill lands mid-run; a short
		// lease, so a killed worker's occurrence is taken over soon.
		Template: schedule.Template{Kind: "sleep", Payload: []byte(`{"duration":"2500ms"}`), WorkerTimeout: task.Duration(time.Second)},
	}
	if _, err := schedule.Add(ctx, store, sch, false); err != nil {
		t.Fatal(err)
	}
	url := "sqlite:" + dbPath
	kinds := []string{"--kinds", "sleep"} // no device kind: no MQTT broker
	w1 := startWorker(t, url, "w1", kinds...)
	w2 := startWorker(t, url, "w2", kinds...)
	w3 := startWorker(t, url, "w3", kinds...)
	start := store.Now()
	steps := []struct {
		at time.Duration
		do func()
	}{
		{6 * time.Second, func() { w1.kill(t) }},
		{12 * time.Second, func() { w1 = startWorker(t, url, "w1", kinds...) }}, // same id: its old process is dead
		{16 * time.Second, func() { w2.kill(t) }},
		{22 * time.Second, func() { w3.kill(t) }}, // only the restarted w1 is left
		{30 * time.Second, func() {}},
	}
	for _, s := range steps {
		time.Sleep(time.Until(start.Add(s.at))) // the timeline is the point: slots must go on through it
		s.do()
	}
	end := store.Now()
	if err := schedule.Remove(ctx, store, "tick"); err != nil {
		t.Fatal(err)
	}
	// The window: whole seconds after the workers had time to start, up to
	// the end. Slots are checked in it; outside it they may or may not be.
	from, to := start.Add(2*time.Second).Truncate(time.Second), end.Add(-time.Second).Truncate(time.Second)
	tasks := waitFinished(t, store, "tick", from, to)
	retried := 0
	for at := from; !at.After(to); at = at.Add(time.Second) {
		tk := tasks[at.Unix()]
		successes := 0
		for _, w := range tk.Attempts {
			if w.State == task.AttemptSuccess {
				successes++
			}
		}
		if tk.State != task.StateSucceeded || successes != 1 {
			t.Errorf("slot %s: task %s is %s with %d successes (want succeeded once): %+v", at.Format(time.TimeOnly), tk.Key, tk.State, successes, tk.Attempts)
		}
		if tk.AttemptsStarted > 1 {
			retried++
		}
	}
	n := int(to.Sub(from)/time.Second) + 1
	t.Logf("%d slots from %s to %s, each one task run once; %d taken over from a killed worker; %d occurrences in all",
		n, from.Format(time.TimeOnly), to.Format(time.TimeOnly), retried, len(tasks))
	if n < 25 {
		t.Errorf("window of %d slots, want about 28", n)
	}
}

// waitFinished waits until every slot of name in [from, to] has a
// finished task, and returns the tasks by slot.
func waitFinished(t *testing.T, store task.Store, name string, from, to time.Time) map[int64]*task.Task {
	t.Helper()
	var tasks map[int64]*task.Task
	var waiting []string
	if !testutil.Within(30*time.Second, func() bool {
		tasks, waiting = occurrences(t, store, name), nil
		for at := from; !at.After(to); at = at.Add(time.Second) {
			if tk := tasks[at.Unix()]; tk == nil {
				waiting = append(waiting, at.Format(time.TimeOnly)+" missing")
			} else if !tk.State.Finished() {
				waiting = append(waiting, at.Format(time.TimeOnly)+" "+string(tk.State))
			}
		}
		return len(waiting) == 0
	}) {
		t.Fatalf("window %s..%s: slots not finished 30s after the end: %v", from.Format(time.TimeOnly), to.Format(time.TimeOnly), waiting)
	}
	return tasks
}

// occurrences returns the schedule's tasks by slot (Unix seconds). Keys
// are unique in the store and SlotOf accepts only the one spelling of a
// slot, so a slot can only ever be one task.
func occurrences(t *testing.T, s task.Store, name string) map[int64]*task.Task {
	t.Helper()
	ts, err := s.List(t.Context(), task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]*task.Task{}
	for _, tk := range ts {
		at, ok := schedule.SlotOf(name, tk.Key)
		if !ok {
			continue
		}
		if at.Nanosecond() != 0 || out[at.Unix()] != nil {
			t.Errorf("slot %s: not a whole second, or published twice (%s)", at, tk.Key)
		}
		out[at.Unix()] = tk
	}
	return out
}
