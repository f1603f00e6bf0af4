package tests

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// TestProcessesOpenNewStoreTogether starts several publishes at once on a
// store file that does not exist yet, as workers started together on a
// fresh host do: every one must succeed (the first connection's switch to
// WAL is taken in turns under the store's write lock, since SQLite's busy
// handler does not wait for it).
func TestProcessesOpenNewStoreTogether(t *testing.T) {
	t.Parallel()
	for round := range 25 {
		url := "sqlite:" + filepath.Join(t.TempDir(), "store.db")
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				if _, stderr, code := runCLI(t, "--store", url, "publish", fmt.Sprintf("k%d", i), "--kind", "noop"); code != 0 {
					t.Errorf("round %d, publish %d: exit %d: %s", round, i, code, stderr)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
	}
}
