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
