// list.go checks List's filters and seq paging (both directions, under
// concurrent inserts) and Stats.

package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// listFixture fills st with tasks varied in every filtered field, plus a
// reserved document, and returns the stored documents in seq order
// (reserved one included).
func listFixture(t *testing.T, st task.Store, base time.Time) []*task.Task {
	t.Helper()
	var docs []*task.Task
	for i := range 24 {
		key := fmt.Sprintf("%s-%02d", []string{"alpha", "beta", "al%_x"}[i%3], i)
		opt := task.Options{}
		// Created just short of a millisecond boundary: the filters
		// compare truncated milliseconds, not rounded ones.
		tk := newTask(t, key, []string{"k1", "k2"}[i%2], base.Add(time.Duration(i)*time.Second+999*time.Microsecond), opt)
		tk.Payload = json.RawMessage(fmt.Sprintf(`{"n": %d, "tag": "%s"}`, i, []string{"red", "green", "blue", "red green"}[i%4]))
		docs = append(docs, mustInsert(t, st, tk))
	}
	at := base.Add(time.Hour)
	for i, d := range docs {
		switch i % 4 {
		case 1: // running under w1, touched later
			docs[i] = mustModify(t, st, d.Key, setWorker("w1", at.Add(time.Duration(i)*time.Second)))
		case 2: // cancelled after w2 ran it
			docs[i] = mustModify(t, st, d.Key, func(tk *task.Task) error {
				if err := setWorker("w2", at)(tk); err != nil {
					return err
				}
				return tk.Cancel(at.Add(time.Duration(i) * time.Second))
			})
		}
	}
	rsv := newTask(t, task.ReservedPrefix+"doorbell", "leasepool.control", base, task.Options{})
	mustInsert(t, st, rsv)
	docs = append(docs, mustModify(t, st, rsv.Key, func(tk *task.Task) error { return tk.Cancel(at) }))
	return docs
}

// setWorker gives the task a live entry of worker id, written at now.
func setWorker(id string, now time.Time) func(tk *task.Task) error {
	return func(tk *task.Task) error {
		tk.AttemptsStarted++
		tk.Attempts = append(tk.Attempts, task.Attempt{WorkerID: id, State: task.AttemptRunning, Attempt: tk.AttemptsStarted, LeaseUntil: now.Add(time.Hour), StartedAt: now})
		tk.UpdatedAt = now.UTC()
		tk.Recompute(now)
		return nil
	}
}

func (s suite) listFilters(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	base := st.Now().Truncate(time.Millisecond).Add(-24 * time.Hour)
	docs := listFixture(t, st, base)
	at := base.Add(time.Hour)
	queries := []task.ListQuery{
		{},
		{State: task.StateRunning},
		{State: task.StateCancelled},
		{Kind: "k2"},
		{Kind: "k1", State: task.StatePending},
		{KeyPrefix: "al"},
		{KeyPrefix: "al%"}, // % and _ mean themselves
		{KeyPrefix: "beta-1"},
		{KeyPrefix: task.ReservedPrefix},
		{WorkerID: "w1"},
		{WorkerID: "w2", Kind: "k1"},
		{WorkerID: "w9"},
		{Text: "red"},
		{Text: `"tag":"green"`},
		{Text: "nothing"},
		{CreatedAfter: base.Add(5 * time.Second)},
		{CreatedBefore: base.Add(5 * time.Second)},
		{CreatedAfter: docs[5].CreatedAt, Kind: "k2"},
		{CreatedBefore: docs[5].CreatedAt.Add(time.Millisecond)},
		{CreatedAfter: base.Add(3 * time.Second), CreatedBefore: base.Add(9 * time.Second), Kind: "k1"},
		{UpdatedAfter: at.Add(-time.Second)},
		{UpdatedAfter: at.Add(5 * time.Second), UpdatedBefore: at.Add(15 * time.Second)},
		{State: task.StateRunning, Text: "red", Desc: true},
		// leasepool's own documents instead of tasks (flow documents)
		{Reserved: true},
		{Reserved: true, Kind: "leasepool.control", State: task.StateCancelled},
		{Reserved: true, KeyPrefix: task.ReservedPrefix + "door"},
		{Reserved: true, Kind: "k1"},
	}
	for _, q := range queries {
		for _, desc := range []bool{false, true} {
			q.Desc = desc
			want := expectList(docs, q)
			got, err := st.List(ctxFor(t), q)
			if err != nil {
				t.Fatalf("List(%+v): %v", q, err)
			}
			if !slices.Equal(keys(got), want) {
				t.Errorf("List(%+v):\n got  %v\n want %v", q, keys(got), want)
			}
			// Paged by 2 gives the same.
			if paged := pageAll(t, st, q, 2); !slices.Equal(paged, want) {
				t.Errorf("List(%+v) by pages of 2:\n got  %v\n want %v", q, paged, want)
			}
		}
	}
	if _, err := st.List(ctxFor(t), task.ListQuery{State: "bogus"}); err == nil {
		t.Error("List with state bogus: no error")
	}
}

// expectList is what q must return from docs, by task.ListQuery.Matches.
func expectList(docs []*task.Task, q task.ListQuery) []string {
	var want []string
	for _, d := range docs {
		if q.Matches(d) && d.Seq > q.AfterSeq && (q.BeforeSeq == 0 || d.Seq < q.BeforeSeq) {
			want = append(want, d.Key)
		}
	}
	if q.Desc {
		slices.Reverse(want)
	}
	if q.Limit > 0 && len(want) > q.Limit {
		want = want[:q.Limit]
	}
	return want
}

// pageAll walks q to the end in pages of n and returns the keys.
func pageAll(t *testing.T, st task.Store, q task.ListQuery, n int) []string {
	t.Helper()
	q.Limit = n
	var out []string
	for range 1000 {
		page, err := st.List(ctxFor(t), q)
		if err != nil {
			t.Fatalf("List(%+v): %v", q, err)
		}
		if len(page) > n {
			t.Fatalf("List(%+v): %d tasks with Limit %d", q, len(page), n)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, keys(page)...)
		if q.Desc {
			q.BeforeSeq = page[len(page)-1].Seq
		} else {
			q.AfterSeq = page[len(page)-1].Seq
		}
	}
	t.Fatalf("List(%+v): no end after 1000 pages", q)
	return nil
}

// listPagingConcurrent walks every task forward, backward, and back again
// from the middle while another goroutine publishes: each walk sees every
// task that existed when it started exactly once, in strict seq order.
func (s suite) listPagingConcurrent(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	now := st.Now()
	var before []*task.Task
	for i := range 60 {
		before = append(before, mustInsert(t, st, newTask(t, fmt.Sprintf("p%03d", i), "k", now, task.Options{})))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tk, err := task.NewTask(task.PublishParams{Key: fmt.Sprintf("new%04d", i), Kind: "k"}, st.Now())
			if err == nil {
				_, _, err = st.Insert(t.Context(), tk)
			}
			if err != nil {
				t.Errorf("concurrent insert: %v", err)
				return
			}
		}
	}()
	walks := []struct {
		name string
		q    task.ListQuery
		want []*task.Task
	}{
		{"forward", task.ListQuery{Kind: "k"}, before},
		{"backward", task.ListQuery{Kind: "k", Desc: true, BeforeSeq: before[len(before)-1].Seq + 1}, before},
		{"newer from the middle", task.ListQuery{Kind: "k", AfterSeq: before[29].Seq}, before[30:]},
	}
	for _, w := range walks {
		got := walkSeqs(t, st, w.q, 7)
		seen := map[string]bool{}
		for _, k := range got {
			if seen[k] {
				t.Errorf("%s: %s listed twice", w.name, k)
			}
			seen[k] = true
		}
		for _, d := range w.want {
			if !seen[d.Key] {
				t.Errorf("%s: %s (existing before the walk) missing", w.name, d.Key)
			}
		}
	}
	close(stop)
	wg.Wait()
}

// walkSeqs pages q by n until a short page, checking that seqs move
// strictly in q's direction, and returns the keys seen.
func walkSeqs(t *testing.T, st task.Store, q task.ListQuery, n int) []string {
	t.Helper()
	q.Limit = n
	var out []string
	var last int64
	for range 10000 {
		page, err := st.List(ctxFor(t), q)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, tk := range page {
			if last != 0 && (q.Desc && tk.Seq >= last || !q.Desc && tk.Seq <= last) {
				t.Fatalf("seq %d after %d (desc %v)", tk.Seq, last, q.Desc)
			}
			last = tk.Seq
			out = append(out, tk.Key)
		}
		if len(page) < n || (!q.Desc && len(out) >= 60) {
			return out // forward walks stop once past the fixture: inserts never end
		}
		if q.Desc {
			q.BeforeSeq = last
		} else {
			q.AfterSeq = last
		}
	}
	t.Fatal("walk did not end")
	return nil
}

func (s suite) stats(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	got, err := st.Stats(ctxFor(t))
	if err != nil {
		t.Fatalf("Stats of an empty store: %v", err)
	}
	if len(got.Counts) != 0 || !got.OldestReadyAt.IsZero() {
		t.Fatalf("Stats of an empty store: %+v", got)
	}
	base := st.Now().Truncate(time.Millisecond).Add(-24 * time.Hour)
	docs := listFixture(t, st, base)
	// One pending task not ready yet: not the oldest ready.
	mustInsert(t, st, newTask(t, "later", "k3", st.Now().Add(time.Hour), task.Options{}))
	got, err = st.Stats(ctxFor(t))
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	want := map[task.StateCount]bool{{State: task.StatePending, Kind: "k3", N: 1}: true}
	counts := map[[2]string]int64{}
	var oldest time.Time
	for _, d := range docs {
		if task.Reserved(d.Key) {
			continue
		}
		counts[[2]string{string(d.State), d.Kind}]++
		if d.State == task.StatePending && (oldest.IsZero() || d.NextClaimAt.Before(oldest)) {
			oldest = d.NextClaimAt
		}
	}
	for k, n := range counts {
		want[task.StateCount{State: task.State(k[0]), Kind: k[1], N: n}] = true
	}
	gotSet := map[task.StateCount]bool{}
	for _, c := range got.Counts {
		if gotSet[c] {
			t.Errorf("Stats: %+v twice", c)
		}
		gotSet[c] = true
	}
	if !maps(gotSet, want) {
		t.Errorf("Stats counts:\n got  %v\n want %v", got.Counts, want)
	}
	if !got.OldestReadyAt.Truncate(time.Millisecond).Equal(oldest.Truncate(time.Millisecond)) {
		t.Errorf("OldestReadyAt = %s, want %s", got.OldestReadyAt, oldest)
	}
	if n := got.ByState()[task.StateCancelled]; n != 6 {
		t.Errorf("cancelled tasks = %d, want 6 (the reserved document is not one)", n)
	}
}

func maps(a, b map[task.StateCount]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
