package tests

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
	"github.com/leasepool/leasepool/worker"
)

// TestElectionAcrossProcesses: of three `leasepool worker` processes on
// one store, one is elected and runs the cluster's duties (retention
// deletes an old finished task). SIGKILLed, another is elected within
// about a lease and runs them; SIGSTOPped past its lease, another again,
// and the frozen one, continued, finds its lease gone and stops its
// duties rather than run them beside the new one. About 15 s.
func TestElectionAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	// The test's own store writes too (electedHolderOrNone's probe), so it
	// may be the one whose fence kills a holder frozen in a write: its log
	// is read below beside the workers'.
	var storeLog testutil.SyncBuffer
	store, err := sqlitestore.Open(ctx, dbPath, &sqlitestore.Config{Logger: slog.New(slog.NewJSONHandler(&storeLog, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	url := "sqlite:" + dbPath
	procs := map[string]*workerProc{}
	for _, id := range []string{"e1", "e2", "e3"} {
		procs[id] = startWorker(t, url, id, "--kinds", "noop", "--retention-every", "1s")
	}

	// elected waits for a worker of this test other than not to hold the
	// election's lease, and returns its id.
	elected := func(not string) string {
		t.Helper()
		var id string
		eventually(t, 30*time.Second, "a worker other than "+not+" elected", func() bool {
			id = electedHolderOrNone(t, store)
			return procs[id] != nil && id != not
		})
		return id
	}
	n := 0
	// runsRetention checks that the elected worker runs the duties: an
	// old finished task goes within a retention period or two.
	runsRetention := func(who string) {
		t.Helper()
		n++
		key := fmt.Sprintf("old-%d", n)
		storetest.PutTask(t, store, key, "k", task.StateSucceeded, store.Now().Add(-48*time.Hour))
		eventually(t, 10*time.Second, "retention on "+who+" to delete "+key, func() bool {
			_, err := store.Get(ctx, key)
			return errors.Is(err, task.ErrNotFound)
		})
	}

	first := elected("")
	runsRetention(first)

	killed := procs[first].kill(t)
	delete(procs, first)
	second := elected(first)
	took := time.Since(killed)
	t.Logf("%s elected %s after %s was SIGKILLed", second, took.Round(time.Millisecond), first)
	if took > worker.ElectionLease+2*time.Second {
		t.Errorf("%s elected %s after %s was killed, want within about a lease (%s)", second, took, first, worker.ElectionLease)
	}
	runsRetention(second)

	frozen := procs[second]
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = frozen.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	third := elected(second)
	took = time.Since(stoppedAt)
	t.Logf("%s elected %s after %s was SIGSTOPped", third, took.Round(time.Millisecond), second)
	// A freeze that lands inside one of its write transactions keeps the
	// store's write lock: no write lands until a peer kills the frozen
	// holder (sqlitestore's fence), and the election follows that kill.
	killedHolding := func() bool {
		line := fmt.Sprintf(`"msg":"killed a process stopped while holding the store's write lock","store":%q,"pid":%d,`, dbPath, frozen.cmd.Process.Pid)
		if strings.Contains(storeLog.String(), line) {
			return true
		}
		for id, p := range procs {
			if id == second {
				continue
			}
			b, err := os.ReadFile(p.cmd.Stdout.(*os.File).Name())
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), line) {
				return true
			}
		}
		return false
	}()
	bound := worker.ElectionLease + 2*time.Second
	if killedHolding {
		bound = sqlitestore.DefaultFrozenWriterKill + 2*time.Second
		t.Logf("%s was frozen holding the store's write lock and killed by a peer", second)
	}
	if took < worker.ElectionLease-worker.ElectionRenew || took > bound {
		t.Errorf("%s elected %s after %s froze, want within %s and not before its lease (%s) can have run out",
			third, took, second, bound, worker.ElectionLease)
	}
	if !killedHolding {
		resume()
		// Woken, it finds the lease ended or taken and stops its duties
		// (its log says so at warn level). Killed, it runs none.
		logPath := frozen.cmd.Stdout.(*os.File).Name()
		eventually(t, 10*time.Second, second+" to log its duties stopped", func() bool {
			b, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			log := string(b)
			return strings.Contains(log, worker.ElectionKey) && (strings.Contains(log, "singleton lease not renewed in time") ||
				strings.Contains(log, "singleton lease lost to another holder"))
		})
	}
	// Either way the lease stays with the third.
	if h := electedHolderOrNone(t, store); h != third {
		t.Errorf("the election's lease held by %q after %s woke or was killed, want %s", h, second, third)
	}
	runsRetention(third)
}

// electedHolderOrNone returns the worker id holding the election's lease,
// or "" when none does.
func electedHolderOrNone(t *testing.T, store task.Store) string {
	t.Helper()
	now := store.Now()
	probe := task.Holder{TaskKey: "probe", WorkerID: "probe"}
	p := task.LockParams{Namespace: task.LockSingleton, Keys: []string{worker.ElectionKey}, Holder: probe, Now: now, Until: now.Add(time.Millisecond)}
	err := store.AcquireLocks(t.Context(), p)
	var locked *task.LockedError
	switch {
	case errors.As(err, &locked):
		return locked.Holder.WorkerID
	case err != nil:
		t.Fatal(err)
	}
	if err := store.ReleaseLocks(t.Context(), task.LockParams{Namespace: task.LockSingleton, Keys: p.Keys, Holder: probe}); err != nil {
		t.Fatal(err)
	}
	return ""
}
