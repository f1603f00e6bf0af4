// queries.go checks the candidate and list queries, their order and
// their paging.

package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// candidateFixture fills st with tasks around now and returns the keys
// expected as ready and as upcoming (unordered).
func candidateFixture(t *testing.T, st task.Store, now time.Time) (ready, upcoming map[string]*task.Task) {
	t.Helper()
	past := now.Add(-time.Hour)
	ins := func(key, kind string, at time.Time, opt task.Options) {
		mustInsert(t, st, newTask(t, key, kind, at, opt))
	}
	// Ready, interleaving priorities with insert order.
	for i, p := range []int{0, 5, 0, 10, 5, 0, -3, 10, 5, 0} {
		kind := "k1"
		if i%3 == 0 {
			kind = "k2"
		}
		ins(fmt.Sprintf("r%02d", i), kind, past.Add(time.Duration(i)*time.Second), task.Options{Priority: p})
	}
	ins("pin-w1", "k1", past, task.Options{Priority: 5, SpecificWorkerIDs: []string{"w1"}})
	ins("pin-w2w3", "k1", past, task.Options{Priority: 5, SpecificWorkerIDs: []string{"w2", "w3"}})
	// Running with a free slot: ready.
	ins("run-free", "k1", past, task.Options{Priority: 5, ConcurrentWorkerCnt: 2})
	mustModify(t, st, "run-free", addWorker("wx", now.Add(30*time.Second), now))
	// Finished: never a candidate.
	ins("done", "k1", past, task.Options{Priority: 100})
	mustModify(t, st, "done", func(tk *task.Task) error { return tk.Cancel(now) })
	ins("done-later", "k1", now.Add(time.Minute), task.Options{})
	mustModify(t, st, "done-later", func(tk *task.Task) error { return tk.Cancel(now) })
	// Upcoming, with ties on next_claim_at.
	for i, d := range []time.Duration{3, 1, 2, 1, 5, 2} {
		ins(fmt.Sprintf("u%02d", i), []string{"k1", "k2"}[i%2], now.Add(d*time.Minute), task.Options{Priority: i})
	}
	// Running and full: upcoming at its lease end.
	ins("run-full", "k2", past, task.Options{})
	mustModify(t, st, "run-full", addWorker("wx", now.Add(30*time.Second), now))
	// Exactly at now: ready.
	ins("at-now", "k1", now, task.Options{Priority: 1})

	ready, upcoming = map[string]*task.Task{}, map[string]*task.Task{}
	all, err := st.List(ctxFor(t), task.ListQuery{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, tk := range all {
		switch {
		case tk.State.Finished():
		case !tk.NextClaimAt.After(now):
			ready[tk.Key] = tk
		default:
			upcoming[tk.Key] = tk
		}
	}
	return ready, upcoming
}

func (s suite) candidates(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	now := st.Now().Truncate(time.Millisecond)
	ready, upcoming := candidateFixture(t, st, now)
	if len(ready) != 14 || len(upcoming) != 7 {
		t.Fatalf("fixture: %d ready, %d upcoming; want 14, 7", len(ready), len(upcoming))
	}
	for _, mode := range []bool{true, false} {
		want := upcoming
		if mode {
			want = ready
		}
		c := candidateCheck{st: st, now: now, mode: mode, want: want}
		t.Run(fmt.Sprintf("Ready=%v", mode), func(t *testing.T) {
			t.Run("All", c.all)
			t.Run("Limit", c.limit)
			t.Run("Paging", c.paging)
			t.Run("Kinds", c.kinds)
			t.Run("WorkerID", c.workerID)
			t.Run("Share", c.share)
		})
	}
}

// candidateCheck checks Candidates in one mode (ready or upcoming) against
// the fixture's tasks of that mode.
type candidateCheck struct {
	st   task.Store
	now  time.Time
	mode bool
	want map[string]*task.Task
}

// expect returns the keys of c.want that pass keep, in q's order.
func (c candidateCheck) expect(q task.CandidateQuery, keep func(*task.Task) bool) []string {
	var ts []*task.Task
	for _, tk := range c.want {
		if keep == nil || keep(tk) {
			ts = append(ts, tk)
		}
	}
	slices.SortFunc(ts, func(a, b *task.Task) int {
		if q.Less(a, b) {
			return -1
		}
		if q.Less(b, a) {
			return 1
		}
		return 0
	})
	return keys(ts)
}

// query runs q, failing on an error or on a finished task returned.
func (c candidateCheck) query(t *testing.T, q task.CandidateQuery) []*task.Task {
	t.Helper()
	got, err := c.st.Candidates(ctxFor(t), q)
	if err != nil {
		t.Fatalf("Candidates(%+v): %v", q, err)
	}
	for _, tk := range got {
		if tk.State.Finished() {
			t.Errorf("Candidates returned %s in state %s", tk.Key, tk.State)
		}
	}
	return got
}

func (c candidateCheck) all(t *testing.T) {
	q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: 100}
	if got, w := keys(c.query(t, q)), c.expect(q, nil); !slices.Equal(got, w) {
		t.Fatalf("got  %v\nwant %v", got, w)
	}
}

func (c candidateCheck) limit(t *testing.T) {
	q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: 3}
	if got, w := keys(c.query(t, q)), c.expect(q, nil)[:3]; !slices.Equal(got, w) {
		t.Fatalf("got  %v\nwant %v", got, w)
	}
}

func (c candidateCheck) paging(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 5} {
		q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: limit}
		var got []string
		for pages := 0; ; pages++ {
			if pages > 50 {
				t.Fatalf("limit %d: paging does not end: %v", limit, got)
			}
			page := c.query(t, q)
			if len(page) > limit {
				t.Fatalf("limit %d: page of %d", limit, len(page))
			}
			got = append(got, keys(page)...)
			if len(page) < limit {
				break
			}
			q.After = page[len(page)-1]
		}
		if w := c.expect(q, nil); !slices.Equal(got, w) {
			t.Fatalf("limit %d: pages gave\n %v\nwant\n %v", limit, got, w)
		}
	}
}

func (c candidateCheck) kinds(t *testing.T) {
	q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: 100, Kinds: []string{"k2"}}
	w := c.expect(q, func(tk *task.Task) bool { return tk.Kind == "k2" })
	if got := keys(c.query(t, q)); !slices.Equal(got, w) || len(w) == 0 {
		t.Fatalf("got  %v\nwant %v", got, w)
	}
	q.Kinds = []string{"k1", "k2"}
	if got, w := keys(c.query(t, q)), c.expect(q, nil); !slices.Equal(got, w) {
		t.Fatalf("both kinds: got  %v\nwant %v", got, w)
	}
}

func (c candidateCheck) workerID(t *testing.T) {
	for _, w := range []string{"w1", "w2", "w9"} {
		q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: 100, WorkerID: w}
		exp := c.expect(q, func(tk *task.Task) bool { return tk.Allows(w) })
		if got := keys(c.query(t, q)); !slices.Equal(got, exp) {
			t.Fatalf("worker %s: got  %v\nwant %v", w, got, exp)
		}
	}
}

// share checks that a share keeps the pinned tasks and those of its
// buckets, alone, with a worker's pins, and across pages.
func (c candidateCheck) share(t *testing.T) {
	var unpinned []*task.Task
	for _, tk := range c.want {
		if len(tk.SpecificWorkerIDs) == 0 {
			unpinned = append(unpinned, tk)
		}
	}
	slices.SortFunc(unpinned, func(a, b *task.Task) int { return int(a.Seq - b.Seq) })
	// Every other unpinned task's bucket, and one bucket no task is in.
	share := []int{(task.ShareBucket(unpinned[0].Seq) + task.ShareBuckets/2) % task.ShareBuckets}
	for i := 0; i < len(unpinned); i += 2 {
		share = append(share, task.ShareBucket(unpinned[i].Seq))
	}
	in := func(tk *task.Task) bool {
		return len(tk.SpecificWorkerIDs) > 0 || slices.Contains(share, task.ShareBucket(tk.Seq))
	}
	for _, w := range []string{"", "w1"} {
		q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: 100, WorkerID: w, Share: share}
		exp := c.expect(q, func(tk *task.Task) bool { return in(tk) && (w == "" || tk.Allows(w)) })
		if got := keys(c.query(t, q)); !slices.Equal(got, exp) || len(exp) == len(c.want) {
			t.Fatalf("worker %q, share %v: got  %v\nwant %v (of %d)", w, share, got, exp, len(c.want))
		}
	}
	q := task.CandidateQuery{Now: c.now, Ready: c.mode, Limit: 2, Share: share}
	var got []string
	for pages := 0; ; pages++ {
		if pages > 50 {
			t.Fatalf("paging a share does not end: %v", got)
		}
		page := c.query(t, q)
		got = append(got, keys(page)...)
		if len(page) < q.Limit {
			break
		}
		q.After = page[len(page)-1]
	}
	if exp := c.expect(q, in); !slices.Equal(got, exp) {
		t.Fatalf("pages of a share gave\n %v\nwant\n %v", got, exp)
	}
}

func (s suite) list(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	now := st.Now()
	var all []string
	for i := range 10 {
		key := fmt.Sprintf("t%02d", i)
		mustInsert(t, st, newTask(t, key, []string{"k1", "k2"}[i%2], now, task.Options{Priority: 10 - i}))
		all = append(all, key)
	}
	for _, k := range []string{"t03", "t04", "t07"} {
		mustModify(t, st, k, func(tk *task.Task) error { return tk.Cancel(now) })
	}
	run := func(t *testing.T, q task.ListQuery) []*task.Task {
		t.Helper()
		got, err := st.List(ctxFor(t), q)
		if err != nil {
			t.Fatalf("List(%+v): %v", q, err)
		}
		return got
	}
	t.Run("All", func(t *testing.T) {
		if got := keys(run(t, task.ListQuery{})); !slices.Equal(got, all) {
			t.Fatalf("got %v; want %v", got, all)
		}
	})
	t.Run("State", func(t *testing.T) {
		if got := keys(run(t, task.ListQuery{State: task.StateCancelled})); !slices.Equal(got, []string{"t03", "t04", "t07"}) {
			t.Fatalf("cancelled: got %v", got)
		}
		if got := keys(run(t, task.ListQuery{State: task.StatePending, Kind: "k2"})); !slices.Equal(got, []string{"t01", "t05", "t09"}) {
			t.Fatalf("pending k2: got %v", got)
		}
	})
	t.Run("Kind", func(t *testing.T) {
		if got := keys(run(t, task.ListQuery{Kind: "k1"})); !slices.Equal(got, []string{"t00", "t02", "t04", "t06", "t08"}) {
			t.Fatalf("k1: got %v", got)
		}
	})
	t.Run("Paging", func(t *testing.T) {
		var got []string
		q := task.ListQuery{Limit: 3}
		for range 10 {
			page := run(t, q)
			if len(page) > 3 {
				t.Fatalf("page of %d with Limit 3", len(page))
			}
			if len(page) == 0 {
				break
			}
			got = append(got, keys(page)...)
			q.AfterSeq = page[len(page)-1].Seq
		}
		if !slices.Equal(got, all) {
			t.Fatalf("pages gave %v; want %v", got, all)
		}
	})
}
