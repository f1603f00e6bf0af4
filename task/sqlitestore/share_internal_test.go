package sqlitestore

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
)

// TestShareBucketSQLIsShareBucket: the SQL the share filter runs gives
// task.ShareBucket's bucket for seqs large and small (rowids reach the
// folded bits after 4,096 tasks).
func TestShareBucketSQLIsShareBucket(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seqs := []int64{0, 1, 4095, 4096, 4097, 1 << 24, 1<<24 + 4097, 1<<62 - 1}
	for range 200 {
		seqs = append(seqs, rand.Int64N(1<<62))
	}
	expr := strings.ReplaceAll(shareBucketSQL, "seq", "?")
	for _, seq := range seqs {
		args := make([]any, strings.Count(expr, "?"))
		for i := range args {
			args[i] = seq
		}
		var got int
		if err := s.rdb.QueryRowContext(t.Context(), "SELECT "+expr, args...).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := task.ShareBucket(seq); got != want {
			t.Fatalf("seq %d: SQL bucket %d, ShareBucket %d", seq, got, want)
		}
	}
}
