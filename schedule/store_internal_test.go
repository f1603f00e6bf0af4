package schedule

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestCursorNeverGoesBack: runners advancing one cursor to different
// slots at once leave it at the latest, and an older slot written after
// it changes nothing.
func TestCursorNeverGoesBack(t *testing.T) {
	t.Parallel()
	s, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := advance(ctx, s, "tick", base.Add(time.Duration(i)*time.Minute)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := advance(ctx, s, "tick", base); err != nil {
		t.Fatal(err)
	}
	cursors, err := loadCursors(ctx, s)
	if want := base.Add(7 * time.Minute); err != nil || !cursors["tick"].Equal(want) {
		t.Fatalf("cursor = %s, %v; want %s", cursors["tick"], err, want)
	}
}
