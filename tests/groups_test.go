package tests

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestGroupConcurrencyUnderKills runs 20 groups, each limited to 3 tasks
// at once, on four `leasepool worker` processes of 16 slots sharing one
// store file, SIGKILLs two of them mid-run (two fresh ones take their
// place), and checks from the store's attempt history that every
// attempt held one of its group's three slots, that no group had more
// than 3 attempts running at once, a killed holder's until its lease
// ended, and that every group started its first task.
func TestGroupConcurrencyUnderKills(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	const groups, perGroup, limit = 20, 15, 3
	for g := range groups {
		if err := control.SetLimit(ctx, store, control.Limit{Target: control.Group(fmt.Sprintf("g%02d", g)), Concurrency: limit}); err != nil {
			t.Fatal(err)
		}
	}
	var ps []task.PublishParams
	for i := range perGroup {
		for g := range groups {
			ps = append(ps, task.PublishParams{
				Key: fmt.Sprintf("g%02d-%02d", g, i), Kind: "sleep", Payload: []byte(`{"duration":"50ms"}`),
				Options: task.Options{Group: fmt.Sprintf("g%02d", g), PingInterval: 400 * time.Millisecond, WorkerTimeout: 3 * time.Second},
			})
		}
	}
	url := "sqlite:" + dbPath
	var workers []*workerProc
	for i := range 4 {
		workers = append(workers, startWorker(t, url, fmt.Sprintf("w%d", i+1), "--concurrency", "16", "--kinds", "sleep"))
	}
	published := time.Now()
	if _, err := task.PublishMany(ctx, store, ps); err != nil {
		t.Fatal(err)
	}
	n := len(ps)
	succeeded := func() int {
		ts, err := store.List(ctx, task.ListQuery{State: task.StateSucceeded})
		if err != nil {
			t.Fatal(err)
		}
		return len(ts)
	}
	eventually(t, time.Minute, "a quarter of the tasks to finish", func() bool { return succeeded() >= n/4 })
	workers[0].kill(t)
	startWorker(t, url, "w5", "--concurrency", "16", "--kinds", "sleep")
	eventually(t, time.Minute, "half of the tasks to finish", func() bool { return succeeded() >= n/2 })
	workers[1].kill(t)
	startWorker(t, url, "w6", "--concurrency", "16", "--kinds", "sleep")
	eventually(t, 2*time.Minute, "every task to succeed", func() bool { return succeeded() == n })

	all, err := store.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	type span struct {
		start, end time.Time
		what       string
	}
	byGroup := map[string][]span{}
	first := map[string]time.Time{}
	killed := 0
	for _, tk := range all {
		for _, a := range slices.Concat(tk.History, tk.Attempts) {
			if a.StartedAt.IsZero() {
				continue
			}
			if len(a.Slots) != 1 || !strings.HasPrefix(a.Slots[0], "group:"+tk.Group+"#") || !slices.Contains([]string{"0", "1", "2"}, strings.TrimPrefix(a.Slots[0], "group:"+tk.Group+"#")) {
				t.Fatalf("task %s attempt %d holds slots %v; want one of group:%s#0..2", tk.Key, a.Attempt, a.Slots, tk.Group)
			}
			end := a.EndedAt
			if end.IsZero() || a.State == task.AttemptExpired {
				end, killed = a.LeaseUntil, killed+1 // its slot was held until then
			}
			byGroup[tk.Group] = append(byGroup[tk.Group], span{a.StartedAt, end, fmt.Sprintf("%s#%d %s %s %v ended=%v lease=%v", tk.Key, a.Attempt, a.WorkerID, a.State, a.Slots, a.EndedAt.Format("05.000"), a.LeaseUntil.Format("05.000"))})
			if f, ok := first[tk.Group]; !ok || a.StartedAt.Before(f) {
				first[tk.Group] = a.StartedAt
			}
		}
	}
	// An attempt starts (started_at) once it holds its slot, and frees it
	// after its outcome (ended_at) is written, or at its lease's end: the
	// store's one clock orders them exactly, an end before the next start.
	for g, spans := range byGroup {
		type edge struct {
			at    time.Time
			delta int
		}
		var edges []edge
		for _, s := range spans {
			edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
		}
		slices.SortFunc(edges, func(a, b edge) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta // ends first
		})
		running, most := 0, 0
		for _, e := range edges {
			running += e.delta
			most = max(most, running)
		}
		if most > limit {
			t.Errorf("group %s had %d attempts running at once; the limit is %d", g, most, limit)
			slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
			for _, s := range spans {
				t.Logf("  %s .. %s %s", s.start.Format("05.000"), s.end.Format("05.000"), s.what)
			}
		}
	}
	if len(first) != groups {
		t.Fatalf("%d groups started; want %d", len(first), groups)
	}
	var slowest time.Duration
	for _, f := range first {
		slowest = max(slowest, f.Sub(published))
	}
	t.Logf("%d tasks, %d attempts cut by a kill; every group's first task started within %s of the publish", n, killed, slowest.Round(time.Millisecond))
}
