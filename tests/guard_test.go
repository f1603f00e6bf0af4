package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// The exec guard tests: an exec program, and whatever it forks, must not
// outlive its worker's lease, however the worker goes away.

// guardRig is a guard test's store file and directory. Its workers run
// exec only: a device worker would lean on the MQTT broker that a frozen
// or killed peer may host.
type guardRig struct {
	dir, url string
	store    *sqlitestore.Store
	ctx      context.Context
}

func newGuardRig(t *testing.T) *guardRig {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return &guardRig{dir: dir, url: "sqlite:" + dbPath, store: store, ctx: ctx}
}

func (r *guardRig) publish(t *testing.T, key, script string, ping, timeout time.Duration) {
	t.Helper()
	payload, err := json.Marshal(map[string]any{"argv": []string{"bash", "-c", script}, "env": map[string]string{"DIR": r.dir}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := task.Publish(r.ctx, r.store, task.PublishParams{
		Key: key, Kind: "exec", Payload: payload,
		Options: task.Options{PingInterval: ping, WorkerTimeout: timeout},
	}); err != nil {
		t.Fatal(err)
	}
}

// forkingHeartbeat is an exec program whose forked grandchild appends a
// heartbeat (wall nanos) to $DIR/hb.WORKER.ATTEMPT every 100ms, n times,
// while the program waits for it. It records its process group, so the
// test can clean up a grandchild that escaped.
func forkingHeartbeat(n int) string {
	return fmt.Sprintf(`echo $$ >> "$DIR/pgids"
hb="$DIR/hb.$LEASEPOOL_WORKER_ID.$LEASEPOOL_ATTEMPT"
( i=0; while [ $i -lt %d ]; do date +%%s%%N >> "$hb"; i=$((i+1)); sleep 0.1; done ) &
wait
true`, n)
}

// killEscaped kills whatever is left of the programs' process groups.
func (r *guardRig) killEscaped(t *testing.T) {
	t.Cleanup(func() {
		b, _ := os.ReadFile(filepath.Join(r.dir, "pgids"))
		for _, f := range strings.Fields(string(b)) {
			if pgid, err := strconv.Atoi(f); err == nil && pgid > 1 {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		}
	})
}

// heartbeats reads the heartbeats of worker's attempts (all of them).
func (r *guardRig) heartbeats(t *testing.T, worker string) []time.Time {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(r.dir, "hb."+worker+".*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			ns, err := strconv.ParseInt(strings.TrimSpace(sc.Text()), 10, 64)
			if err != nil {
				continue // a line being written
			}
			out = append(out, time.Unix(0, ns))
		}
		f.Close()
	}
	return out
}

func last(ts []time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

func first(ts []time.Time) time.Time {
	f := ts[0]
	for _, t := range ts {
		if t.Before(f) {
			f = t
		}
	}
	return f
}

func (r *guardRig) get(t *testing.T, key string) *task.Task {
	t.Helper()
	tk, err := r.store.Get(r.ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestGuardForkingProgramDiesWithKilledWorker: worker A runs an exec
// program whose grandchild writes heartbeats; A is SIGKILLed. The
// grandchild must stop within A's lease, so that its last heartbeat comes
// before the first heartbeat of peer B's run: no two runs overlap.
func TestGuardForkingProgramDiesWithKilledWorker(t *testing.T) {
	r := newGuardRig(t)
	r.killEscaped(t)
	const lease = 1500 * time.Millisecond
	r.publish(t, "forky", forkingHeartbeat(40), 250*time.Millisecond, lease)

	a := startRaceGuardedWorker(t, r.url, "A", "--kinds", "exec")
	eventually(t, 30*time.Second, "A's program to beat", func() bool { return len(r.heartbeats(t, "A")) >= 3 })
	startRaceGuardedWorker(t, r.url, "B", "--kinds", "exec")
	killedAt := a.kill(t)
	eventually(t, 30*time.Second, "B to take over", func() bool { return len(r.heartbeats(t, "B")) > 0 })
	// By the end of B's run, an escaped grandchild of A would have beaten
	// through it (both beat the same number of times).
	eventually(t, time.Minute, "the task to succeed", func() bool { return r.get(t, "forky").State == task.StateSucceeded })
	firstB := first(r.heartbeats(t, "B"))
	lastA := last(r.heartbeats(t, "A"))
	t.Logf("A killed; its program's last heartbeat %s after the kill; B's first %s after the kill; overlap %.3fs",
		lastA.Sub(killedAt), firstB.Sub(killedAt), lastA.Sub(firstB).Seconds())
	if !lastA.Before(firstB) {
		t.Errorf("A's forked program beat until %s after B's run began: two live runs overlap", lastA.Sub(firstB))
	}
	if lastA.Sub(killedAt) > lease {
		t.Errorf("A's forked program beat %s after A was killed, beyond its lease %s", lastA.Sub(killedAt), lease)
	}
}

// TestGuardFrozenWorkerLosesItsProgram: worker A is SIGSTOPped for longer
// than its lease while its exec program beats; peer B takes over. A's
// program (and its grandchild) must stop before B's run begins, though A
// cannot act; once A is resumed (SIGCONT) it writes no success for the
// lease it lost, and its program does not come back.
func TestGuardFrozenWorkerLosesItsProgram(t *testing.T) {
	r := newGuardRig(t)
	r.killEscaped(t)
	const lease, freeze = 2 * time.Second, 5 * time.Second
	r.publish(t, "frozen", forkingHeartbeat(50), 250*time.Millisecond, lease)

	a := startRaceGuardedWorker(t, r.url, "A", "--kinds", "exec")
	eventually(t, 30*time.Second, "A's program to beat", func() bool { return len(r.heartbeats(t, "A")) >= 3 })
	startRaceGuardedWorker(t, r.url, "B", "--kinds", "exec")
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	eventually(t, 30*time.Second, "B to take over", func() bool { return len(r.heartbeats(t, "B")) > 0 })
	firstB := first(r.heartbeats(t, "B"))
	eventually(t, 30*time.Second, "the freeze to last", func() bool { return time.Since(stoppedAt) > freeze })
	lastA := last(r.heartbeats(t, "A"))
	beatsA := len(r.heartbeats(t, "A"))
	resume()
	resumedAt := time.Now()
	t.Logf("A frozen; its program's last heartbeat %s after the freeze; B's first %s after it; overlap %.3fs",
		lastA.Sub(stoppedAt), firstB.Sub(stoppedAt), lastA.Sub(firstB).Seconds())
	if !lastA.Before(firstB) {
		t.Errorf("frozen A's program beat until %s after B's run began: two live runs overlap", lastA.Sub(firstB))
	}
	if lastA.Sub(stoppedAt) > lease {
		t.Errorf("frozen A's program beat %s after the freeze, beyond its lease %s", lastA.Sub(stoppedAt), lease)
	}

	eventually(t, time.Minute, "the task to succeed", func() bool { return r.get(t, "frozen").State == task.StateSucceeded })
	// A, awake, must see its lease lost: poll until it has had several ping
	// intervals to act, then check it recorded nothing good.
	eventually(t, 10*time.Second, "A to run a while after SIGCONT", func() bool { return time.Since(resumedAt) > 2*time.Second })
	tk := r.get(t, "frozen")
	for _, w := range tk.Attempts {
		if w.WorkerID == "A" && w.State == task.AttemptSuccess {
			t.Errorf("A recorded a success for the lease it lost: %+v", tk.Attempts)
		}
	}
	if n := len(r.heartbeats(t, "A")); n != beatsA {
		t.Errorf("A's program beat %d more times after SIGCONT", n-beatsA)
	}
}

// TestGuardGracefulStopTermsThenKills: a worker asked to stop (SIGTERM)
// with --shutdown-timeout 300ms and --kill-grace 1s sends its exec
// programs SIGTERM (one traps it and writes a marker), then SIGKILLs the
// one that ignores SIGTERM once the grace has passed, not before.
func TestGuardGracefulStopTermsThenKills(t *testing.T) {
	r := newGuardRig(t)
	r.killEscaped(t)
	const shutdown, grace = 300 * time.Millisecond, time.Second
	r.publish(t, "polite", `echo $$ >> "$DIR/pgids"; trap 'echo got-term > "$DIR/term-marker"; exit 0' TERM
while true; do date +%s%N >> "$DIR/hb.polite.1"; sleep 0.1; done`, 250*time.Millisecond, 2*time.Second)
	r.publish(t, "stubborn", `echo $$ >> "$DIR/pgids"; trap '' TERM
while true; do date +%s%N >> "$DIR/hb.stubborn.1"; sleep 0.1; done`, 250*time.Millisecond, 2*time.Second)

	w := startRaceGuardedWorker(t, r.url, "W", "--kinds", "exec", "--concurrency", "2", "--shutdown-timeout", shutdown.String(), "--kill-grace", grace.String())
	eventually(t, 30*time.Second, "both programs to beat", func() bool {
		return len(r.heartbeats(t, "polite")) >= 2 && len(r.heartbeats(t, "stubborn")) >= 2
	})
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	termAt := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- w.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("worker exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not exit after SIGTERM")
	}
	if b, err := os.ReadFile(filepath.Join(r.dir, "term-marker")); err != nil || strings.TrimSpace(string(b)) != "got-term" {
		t.Errorf("the program trapping SIGTERM did not get it: %q, %v", b, err)
	}
	stubbornEnd := last(r.heartbeats(t, "stubborn")).Sub(termAt)
	t.Logf("the program ignoring SIGTERM beat until %s after the worker's SIGTERM (shutdown timeout %s, kill grace %s)", stubbornEnd, shutdown, grace)
	// Heartbeats come every ~100ms: the last one falls within 300ms before
	// the kill; the upper margin allows for a loaded machine.
	if lo, hi := shutdown+grace-300*time.Millisecond, shutdown+grace+1500*time.Millisecond; stubbornEnd < lo || stubbornEnd > hi {
		t.Errorf("the program ignoring SIGTERM stopped %s after the worker's SIGTERM, want within [%s, %s]", stubbornEnd, lo, hi)
	}
	n := len(r.heartbeats(t, "stubborn"))
	eventually(t, 5*time.Second, "a moment to pass", func() bool { return time.Since(termAt) > shutdown+grace+2*time.Second })
	if m := len(r.heartbeats(t, "stubborn")); m != n {
		t.Errorf("the program ignoring SIGTERM still beats after the worker exited")
	}
}
