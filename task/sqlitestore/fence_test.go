package sqlitestore_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// The test binary runs as a lock holder when holderEnv is set (see
// TestMain): it takes the store's write lock the way a Store's writer does
// (flock on the -lock file, then a write transaction), says "holding", and
// then holds on until a line comes on stdin (mode "stop": the test stops
// it meanwhile) or for holdFor while running (mode "busy").
const (
	holderEnv     = "LEASEPOOL_TEST_LOCK_HOLDER"
	holderPathEnv = "LEASEPOOL_TEST_LOCK_HOLDER_PATH"
	holdFor       = 2500 * time.Millisecond
)

func holdWriteLock(mode, path string) {
	ctx := context.Background()
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	f, err := os.OpenFile(path+"-lock", os.O_RDWR, 0)
	if err != nil {
		fail(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		fail(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		fail(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		fail(err)
	}
	for _, q := range []string{"BEGIN IMMEDIATE", "CREATE TABLE uncommitted(x)"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			fail(err)
		}
	}
	fmt.Println("holding")
	if mode == "stop" {
		bufio.NewReader(os.Stdin).ReadString('\n')
	} else {
		time.Sleep(holdFor) // holds the write lock for holdFor: the point of this process
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		fail(err)
	}
	os.Exit(0)
}

// holder is a lock holder process; a line on release ends its hold
// (mode "stop").
type holder struct {
	*exec.Cmd
	release io.WriteCloser
}

// startHolder starts a lock holder on the store at path and returns once
// it holds the lock (and, in mode "stop", is stopped).
func startHolder(t *testing.T, path, mode string) holder {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), holderEnv+"="+mode, holderPathEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	release, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "holding" {
		t.Fatalf("lock holder: %q", line)
	}
	if mode == "stop" {
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	if mode == "stop" {
		testutil.Eventually(t, 10*time.Second, "the lock holder to stop", func() bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
			i := strings.LastIndexByte(string(b), ')')
			return i > 0 && i+2 < len(b) && b[i+2] == 'T'
		})
	}
	return holder{cmd, release}
}

// publishTimed publishes one task and returns how long it took.
func publishTimed(t *testing.T, s *sqlitestore.Store, key string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: key, Kind: "k"}); err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
	return time.Since(began)
}

// TestFrozenWriterIsKilled: a process stopped in the middle of a write
// transaction holds the write lock; a writer waiting for it kills it once
// it has been stopped for FrozenWriterKill, and its uncommitted write is
// gone.
func TestFrozenWriterIsKilled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	const bound = time.Second
	s := open(t, path, &sqlitestore.Config{FrozenWriterKill: bound})
	holder := startHolder(t, path, "stop")

	took := publishTimed(t, s, "after-freeze")
	t.Logf("a write waited %s for a holder stopped in its transaction (kill after %s)", took.Round(time.Millisecond), bound)
	if took < bound {
		t.Errorf("the write went through after %s, before the holder could have been killed", took)
	}
	err := holder.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the stopped holder ended with %v, want SIGKILL", err)
	}
	if _, err := s.Get(context.Background(), "after-freeze"); err != nil {
		t.Errorf("the write that waited is not in the store: %v", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = 'uncommitted'").Scan(&n); err != nil || n != 0 {
		t.Errorf("the killed holder's uncommitted write is visible (%d tables, %v)", n, err)
	}
}

// TestRunningWriterIsNotKilled: a holder that keeps the write lock longer
// than FrozenWriterKill but is not stopped is waited for, not killed.
func TestRunningWriterIsNotKilled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	s := open(t, path, &sqlitestore.Config{FrozenWriterKill: 500 * time.Millisecond})
	holder := startHolder(t, path, "busy")

	took := publishTimed(t, s, "after-hold")
	if err := holder.Wait(); err != nil {
		t.Errorf("the running holder was disturbed: %v", err)
	}
	if took < holdFor/2 {
		t.Errorf("the write went through after %s while another process held the lock for %s", took, holdFor)
	}
}

// TestFrozenWriterKillOff: with FrozenWriterKill negative a stopped holder
// is waited for until it resumes.
func TestFrozenWriterKillOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	s := open(t, path, &sqlitestore.Config{FrozenWriterKill: -1})
	holder := startHolder(t, path, "stop")
	time.AfterFunc(2*time.Second, func() {
		holder.Process.Signal(syscall.SIGCONT)
		io.WriteString(holder.release, "release\n")
	})

	took := publishTimed(t, s, "after-resume")
	if err := holder.Wait(); err != nil {
		t.Errorf("the stopped holder was not left to resume: %v", err)
	}
	if took < 2*time.Second {
		t.Errorf("the write went through after %s, before the holder resumed", took)
	}
}
