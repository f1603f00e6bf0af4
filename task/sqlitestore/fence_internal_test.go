package sqlitestore

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func TestFlockHolders(t *testing.T) {
	locks := []byte(`1: POSIX  ADVISORY  WRITE 111 fd:01:4242 0 EOF
2: FLOCK  ADVISORY  WRITE 222 fd:01:9999 0 EOF
2: -> FLOCK  ADVISORY  WRITE 333 fd:01:4242 0 EOF
3: FLOCK  ADVISORY  WRITE 444 00:27:4242 0 EOF
4: FLOCK  ADVISORY  WRITE 555 fd:01:14242 0 EOF
5: FLOCK  ADVISORY  WRITE -7 fd:01:4242 0 EOF
6: FLOCK  ADVISORY  WRITE 1 fd:01:4242 0 EOF
`)
	// Not the POSIX lock, another inode, the waiter, a remote (negative)
	// pid or this process; any device, since stat's may differ.
	if got := flockHolders(locks, 4242, 1); !slices.Equal(got, []int{444}) {
		t.Errorf("holders = %v, want [444]", got)
	}
}

func TestReadProcStat(t *testing.T) {
	st, ok := readProcStat(os.Getpid())
	if !ok || st.pid != os.Getpid() || st.state != 'R' && st.state != 'S' || st.start == 0 {
		t.Errorf("this process: %+v, %v; want running or sleeping, with a start time", st, ok)
	}
	for _, pid := range []int{0, -1} {
		if _, ok := readProcStat(pid); ok {
			t.Errorf("pid %d read as a process", pid)
		}
	}
}

// TestPauseAllWrites: while paused, a Store's writes wait; a closed Store
// is no longer paused (nor kept).
func TestPauseAllWrites(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	a, err := Open(ctx, dir+"/a.db", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, dir+"/b.db", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	writable.Lock()
	kept := writable.stores[b]
	writable.Unlock()
	if kept {
		t.Error("a closed store is still registered for pausing")
	}
	resume := PauseAllWrites()
	wrote := make(chan error, 1)
	go func() {
		_, _, err := task.Publish(ctx, a, task.PublishParams{Key: "k", Kind: "k"})
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("a write went through while paused (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	resume()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}
