package sqlitestore

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

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
