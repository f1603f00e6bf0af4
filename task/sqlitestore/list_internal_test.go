package sqlitestore

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// TestListKeyPrefixPlans lists by key prefix through both plans (the key
// index for a narrow prefix, the seq walk for a common one) and gets the
// same pages from each.
func TestListKeyPrefixPlans(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 40 {
		key := fmt.Sprintf("%s-%02d", []string{"ab", "abc", "b", "ab\u00e9"}[i%4], i)
		tk, err := task.NewTask(task.PublishParams{Key: key, Kind: "k"}, s.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Insert(t.Context(), tk); err != nil {
			t.Fatal(err)
		}
	}
	old := narrowPrefix
	defer func() { narrowPrefix = old }()
	for _, prefix := range []string{"ab", "abc-", "ab\u00e9", "b-1", "zz"} {
		for _, desc := range []bool{false, true} {
			var got [2][]string
			for i, n := range []int{0, 1000} {
				narrowPrefix = n
				q := task.ListQuery{KeyPrefix: prefix, Desc: desc, Limit: 3}
				for {
					page, err := s.List(t.Context(), q)
					if err != nil {
						t.Fatal(err)
					}
					if len(page) == 0 {
						break
					}
					for _, tk := range page {
						got[i] = append(got[i], tk.Key)
					}
					if desc {
						q.BeforeSeq = page[len(page)-1].Seq
					} else {
						q.AfterSeq = page[len(page)-1].Seq
					}
				}
			}
			if !slices.Equal(got[0], got[1]) {
				t.Errorf("prefix %q desc %v: seq walk %v, key index %v", prefix, desc, got[0], got[1])
			}
			for _, k := range got[0] {
				if len(k) < len(prefix) || k[:len(prefix)] != prefix {
					t.Errorf("prefix %q listed %q", prefix, k)
				}
			}
			if prefix != "zz" && len(got[0]) == 0 {
				t.Errorf("prefix %q listed nothing", prefix)
			}
		}
	}
}

// TestListKindAndStateWalksTheSmaller lists by kind and state, which
// walks the index by state or the one by kind, whichever task_counts says
// is smaller, and gets the right tasks either way.
func TestListKindAndStateWalksTheSmaller(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Kind "big": 30 pending, 2 running; kind "small": 3 pending, 1 running.
	for i, c := range []struct {
		kind             string
		pending, running int
	}{{"big", 30, 2}, {"small", 3, 1}} {
		for j := range c.pending + c.running {
			tk, err := task.NewTask(task.PublishParams{Key: fmt.Sprintf("%s-%d-%d", c.kind, i, j), Kind: c.kind}, s.Now())
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Insert(t.Context(), tk); err != nil {
				t.Fatal(err)
			}
			if j >= c.pending {
				tk.State = task.StateRunning
				if err := s.Update(t.Context(), tk); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, c := range []struct {
		kind  string
		state task.State
		index string
		n     int
	}{
		{"big", task.StateRunning, "tasks_state_seq", 2},   // 3 running < 32 big
		{"small", task.StatePending, "tasks_kind_seq", 3},  // 4 small < 33 pending
		{"big", task.StatePending, "tasks_kind_seq", 30},   // 32 big < 33 pending
		{"small", task.StateRunning, "tasks_state_seq", 1}, // 3 running < 4 small
		{"none", task.StateRunning, "tasks_kind_seq", 0},   // 0 none
	} {
		index, err := s.narrower(t.Context(), c.kind, c.state)
		if err != nil {
			t.Fatal(err)
		}
		if index != c.index {
			t.Errorf("kind %s, state %s: walks %s, want %s", c.kind, c.state, index, c.index)
		}
		page, err := s.List(t.Context(), task.ListQuery{Kind: c.kind, State: c.state})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) != c.n {
			t.Errorf("kind %s, state %s: listed %d, want %d", c.kind, c.state, len(page), c.n)
		}
		for _, tk := range page {
			if tk.Kind != c.kind || tk.State != c.state {
				t.Errorf("kind %s, state %s: listed %s (%s, %s)", c.kind, c.state, tk.Key, tk.Kind, tk.State)
			}
		}
	}
}

// TestUpcomingPageOverSQLiteVariableLimit reads an upcoming page of more
// tasks than SQLite takes bound variables (32,766), in order.
func TestUpcomingPageOverSQLiteVariableLimit(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 33_000
	now := s.Now()
	// Rows written directly, in one statement: publishing 33,000 tasks one
	// by one takes half a minute under the race detector. Task i is due
	// (n-i) ms after an hour from now, at priority i%3.
	base := now.Add(time.Hour).Truncate(time.Millisecond).UnixMilli()
	if _, err := s.wdb.ExecContext(t.Context(), `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?)
		INSERT INTO tasks (key, kind, state, next_claim_at, priority, pinned, version, doc, updated_at)
		SELECT 't' || i, 'k', 'pending', (? + ? - i) * 1000000, i % 3, '', 1,
			json_object('key', 't' || i, 'kind', 'k', 'state', 'pending', 'priority', i % 3, 'version', 1,
				'next_claim_at', strftime('%Y-%m-%dT%H:%M:%fZ', (? + ? - i) / 1000.0, 'unixepoch')), 0
		FROM c`, n, base, n, base, n); err != nil {
		t.Fatal(err)
	}
	page, err := s.Candidates(t.Context(), task.CandidateQuery{Now: now, Limit: n + 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != n {
		t.Fatalf("upcoming page of %d tasks; want %d", len(page), n)
	}
	q := task.CandidateQuery{Now: now}
	for i := 1; i < len(page); i++ {
		if !q.Less(page[i-1], page[i]) {
			t.Fatalf("upcoming page out of order at %d: %s (%s) before %s (%s)", i,
				page[i-1].Key, page[i-1].NextClaimAt, page[i].Key, page[i].NextClaimAt)
		}
	}
}
