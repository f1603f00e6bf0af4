package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestCtrlZStopsBetweenWrites: a busy `leasepool worker` on the embedded
// store, sent SIGTSTP (a shell's Ctrl-Z) again and again, stops every time
// and never while holding the store's write lock: another process writes
// while it is stopped, and it drains its tasks once continued.
func TestCtrlZStopsBetweenWrites(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, &sqlitestore.Config{FrozenWriterKill: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w := startWorker(t, "sqlite:"+dbPath, "w", "--kinds", "noop", "--concurrency", "32")
	pid := w.cmd.Process.Pid

	// Publishers keep the worker claiming and finishing throughout.
	pubCtx, stopPublishing := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var published sync.Map
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; pubCtx.Err() == nil; i++ {
				key := fmt.Sprintf("busy-%d-%d", g, i)
				if _, _, err := task.Publish(pubCtx, store, task.PublishParams{Key: key, Kind: "noop"}); err == nil {
					published.Store(key, true)
				}
			}
		}()
	}
	defer func() { stopPublishing(); wg.Wait() }()
	eventually(t, 30*time.Second, "the worker to finish tasks", func() bool { return succeeded(t, store) > 100 })

	const stops = 15
	for i := range stops {
		if err := w.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the worker to stop on SIGTSTP", func() bool { return procState(pid) == 'T' })
		if holdsFlock(t, pid, dbPath+"-lock") {
			locks, _ := os.ReadFile("/proc/locks")
			var threads []string
			ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			for _, e := range ents {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, e.Name()))
				wc, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, e.Name()))
				threads = append(threads, string(b[strings.LastIndexByte(string(b), ')')+2])+":"+string(wc))
			}
			t.Errorf("stop %d: the worker stopped holding the store's write lock\n%s\n%v", i+1, locks, threads)
			w.cmd.Process.Signal(syscall.SIGCONT)
			break
		}
		probe := fmt.Sprintf("probe-%d", i)
		writeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _, err := task.Publish(writeCtx, store, task.PublishParams{Key: probe, Kind: "noop"})
		cancel()
		if err != nil {
			t.Fatalf("stop %d: another process could not write while the worker was stopped: %v", i+1, err)
		}
		published.Store(probe, true)
		before := succeeded(t, store)
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the worker to work again", func() bool { return succeeded(t, store) > before })
	}
	stopPublishing()
	wg.Wait()
	n := 0
	published.Range(func(any, any) bool { n++; return true })
	eventually(t, time.Minute, "every published task to succeed", func() bool { return succeeded(t, store) >= n })
	if procState(pid) == 'T' {
		t.Error("the worker is still stopped")
	}
	t.Logf("%d stops; %d tasks, all succeeded", stops, n)
}

// TestCtrlZRightAfterContinueStops: a Ctrl-Z that comes just after the
// worker is continued stops it again. Only one that comes while it pauses
// its writes for the previous stop is the same stop.
func TestCtrlZRightAfterContinueStops(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w := startWorker(t, "sqlite:"+dbPath, "w", "--kinds", "noop")
	pid := w.cmd.Process.Pid
	eventually(t, 30*time.Second, "the worker to register", func() bool { _, ok := registered(t, store, "w"); return ok })
	if err := w.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the worker to stop on SIGTSTP", func() bool { return procState(pid) == 'T' })
	for i := range 10 {
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := w.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, fmt.Sprintf("the worker to stop on the SIGTSTP right after continue %d", i+1),
			func() bool { return procState(pid) == 'T' })
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// succeeded counts the store's succeeded tasks.
func succeeded(t *testing.T, s task.Store) int {
	t.Helper()
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(st.ByState()[task.StateSucceeded])
}

// procState is the state letter of process pid (R, S, T...), 0 if gone.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(b), ')')
	if err != nil || i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// holdsFlock reports whether process pid holds a flock on path, from
// /proc/locks.
func holdsFlock(t *testing.T, pid int, path string) bool {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	ino := ":" + strconv.FormatUint(st.Ino, 10)
	for _, line := range strings.Split(string(locks), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "FLOCK" && f[4] == strconv.Itoa(pid) && strings.HasSuffix(f[5], ino) {
			return true
		}
	}
	return false
}
