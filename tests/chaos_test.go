package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// The chaos tests (issue 8): worker processes running forking exec
// programs are SIGKILLed and frozen (SIGSTOP past their lease, then
// SIGCONT) at random while they work through a mix of tasks; no two live
// runs of a task may overlap, and every task must succeed in bounded time.

// mongoChaosTasks is the size of TestMongoChaos: enough that every mix of
// options below keeps its share of kills and freezes, few enough that the
// package's run stays short under -race on a 2-core machine, where
// mongo-java-server runs tens of tasks a second and one task in ten runs a
// forking program for 3.5 s.
const mongoChaosTasks = 600

// sqliteChaosTasks is the size of TestSQLiteChaos, sized like the Mongo
// run's chaos (several kills and freezes) at a fraction of its time.
const sqliteChaosTasks = 300

// TestMongoChaos runs the chaos on the MongoDB wire test server: a server
// of its own (in memory, a fresh database in it), because the shared
// server serves every other test beside it, so on the shared server this
// run's throughput would depend on what else runs.
func TestMongoChaos(t *testing.T) {
	ctx := testContext(t, 7*time.Minute)
	base, _, _ := testservers.StartMongo(t, "")
	uri := mongoDBURI(t, base)
	store := openMongoStore(t, ctx, uri, nil)
	runChaos(t, ctx, chaosBackend{
		name: "mongo", url: uri, store: store, tasks: mongoChaosTasks,
		succeeded: func() int { return countState(t, ctx, store, task.StateSucceeded) },
	})
}

// TestSQLiteChaos runs the same chaos on the embedded store: four worker
// processes sharing one SQLite file with the test.
func TestSQLiteChaos(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	runChaos(t, ctx, chaosBackend{
		name: "sqlite", url: "sqlite:" + dbPath, store: store, tasks: sqliteChaosTasks,
		succeeded: func() int {
			ts, err := store.List(ctx, task.ListQuery{State: task.StateSucceeded})
			if err != nil {
				t.Fatal(err)
			}
			return len(ts)
		},
	})
}

// chaosStore is what the chaos needs of a backend's store: the store, and
// its clock for delayed tasks.
type chaosStore interface {
	task.Store
	Now() time.Time
}

// chaosBackend is one store the chaos runs on.
type chaosBackend struct {
	name      string
	url       string // the workers' --store
	store     chaosStore
	tasks     int
	succeeded func() int // how many tasks have succeeded
}

// The chaos leases are twice those of the other end-to-end tests: on a
// loaded 2-core machine, with -race, renewals of four busy workers take
// hundreds of milliseconds, and a 1s lease then expires under live
// workers so often that tasks run out of retries.
const (
	chaosPing    = 400 * time.Millisecond
	chaosTimeout = 2 * time.Second
	chaosLocks   = 4
	// chaosRetries is each task's budget of lost leases. Beside the
	// kills and freezes, a loaded machine makes live workers lose leases
	// (a busy multi-worker task lost twelve in one run), and a task that
	// runs out of retries fails the test though nothing overlapped.
	chaosRetries = 30
	// chaosLong is the run of one task in ten: longer than a lease plus a
	// takeover, so that a program outliving its worker's loss would still
	// run when the next holder starts.
	chaosLong = chaosTimeout * 7 / 4
)

// chaosPlan is what was published, for the checks.
type chaosPlan struct {
	allowed  map[string]int      // live attempts a task allows
	pins     map[string][]string // its specific worker ids
	lockKeys map[string][]string
	runAt    map[string]time.Time
}

// publishChaos publishes n forking exec tasks that mix priorities, delays,
// pins (to two of the four ids), two concurrent workers with two
// successes, a few shared lock keys and long runs, with short leases and
// chaosRetries retries.
func publishChaos(t *testing.T, ctx context.Context, store chaosStore, n int, ids []string, runLog string) chaosPlan {
	t.Helper()
	plan := chaosPlan{allowed: map[string]int{}, pins: map[string][]string{}, lockKeys: map[string][]string{}, runAt: map[string]time.Time{}}
	long := 0
	for i := range n {
		run := time.Duration(50+i%5*100) * time.Millisecond
		if i%10 == 7 {
			run = chaosLong
			long++
		}
		p := task.PublishParams{
			Key: fmt.Sprintf("c%04d", i), Kind: "exec",
			Payload: json.RawMessage(forkingExecPayload(runLog, run)),
			Options: task.Options{PingInterval: chaosPing, WorkerTimeout: chaosTimeout, Priority: i % 4, MaxUnexpectedRetries: chaosRetries},
		}
		if i%10 == 3 {
			p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 2, 2
		}
		if i%7 == 1 {
			p.SpecificWorkerIDs = []string{ids[i%4], ids[(i+1)%4]}
		}
		if i%11 == 5 && p.ConcurrentWorkerCnt < 2 {
			p.LockKeys = []string{fmt.Sprintf("res-%d", i%chaosLocks)}
		}
		if i%9 == 2 {
			p.RunAt = store.Now().Add(time.Duration(2+i%4) * time.Second)
		}
		tk, _, err := task.Publish(ctx, store, p)
		if err != nil {
			t.Fatal(err)
		}
		plan.allowed[p.Key] = tk.ConcurrentWorkerCnt
		if len(p.SpecificWorkerIDs) > 0 {
			plan.pins[p.Key] = p.SpecificWorkerIDs
		}
		if len(p.LockKeys) > 0 {
			plan.lockKeys[p.Key] = p.LockKeys
		}
		if !p.RunAt.IsZero() {
			plan.runAt[p.Key] = tk.RunAt
		}
	}
	t.Logf("published %d tasks: %d pinned, %d with lock keys, %d delayed, %d running %s", n, len(plan.pins), len(plan.lockKeys), len(plan.runAt), long, chaosLong)
	return plan
}

// forkingExecPayload is an exec task whose program forks the work: a
// background subshell (the guard's grandchild) appends "start", then a
// "beat" every ~50ms until run has passed, then "end" (key attempt worker
// event nanos pid) to logPath, while the program waits for it. The beats
// make a descendant that outlives its holder visible in the log. The
// subshell sleeps with read -t on a pipe and stamps with EPOCHREALTIME, so
// a beat forks nothing: thirty-two programs beating must not load the
// machine.
func forkingExecPayload(logPath string, run time.Duration) string {
	script := fmt.Sprintf(`(
  exec {z}<> <(:)
  line() { echo "$LEASEPOOL_TASK_KEY $LEASEPOOL_ATTEMPT $LEASEPOOL_WORKER_ID $1 ${EPOCHREALTIME/./}000 $BASHPID" >> %q; }
  line start
  until=$(( ${EPOCHREALTIME/./} + %d ))
  while (( ${EPOCHREALTIME/./} < until )); do read -t 0.05 -u $z; line beat; done
  line end
) &
wait
true`, logPath, run.Microseconds())
	return fmt.Sprintf(`{"argv":["bash","-c",%q]}`, script)
}

// chaos is the worker processes of one run and what was done to them.
type chaos struct {
	t       *testing.T
	b       chaosBackend
	ids     []string
	workers map[string]*workerProc
	// losses are the times each worker id lost its process: SIGKILLs
	// and SIGSTOPs, in order.
	losses       map[string][]time.Time
	kills, stops int
}

// start starts worker id. Its retry backoff starts at 100ms rather than
// 1s: a lost lease counts as a failure, and a task that lost eight would
// otherwise wait about two minutes before its next try, beyond the bound.
func (c *chaos) start(id string) {
	c.workers[id] = startWorker(c.t, c.b.url, id, "--concurrency", "8", "--kinds", "exec", "--backoff", "100ms")
}

// kill SIGKILLs worker id and starts it again under the same id 300ms
// later.
func (c *chaos) kill(id string) {
	c.losses[id] = append(c.losses[id], c.workers[id].kill(c.t))
	c.kills++
	time.Sleep(300 * time.Millisecond) // the restart's gap: part of the chaos
	c.start(id)
}

// freeze SIGSTOPs worker id for 1.5-2 leases, then SIGCONTs it: its
// leases run out while it cannot act, and peers take its tasks over.
func (c *chaos) freeze(id string) {
	p := c.workers[id].cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatal(err)
	}
	c.losses[id] = append(c.losses[id], time.Now())
	c.stops++
	defer func() {
		if err := p.Signal(syscall.SIGCONT); err != nil {
			c.t.Errorf("SIGCONT %s: %v", id, err)
		}
	}()
	time.Sleep(chaosTimeout*3/2 + rand.N(chaosTimeout/2)) // frozen past its leases: the point of a freeze
}

// run is the chaos loop: every 1-2 leases it kills or (the second of
// every three times) freezes a random worker, until 95% of the tasks have
// succeeded and it has done both, or every task has, or two minutes
// passed; then the rest must finish without chaos within two minutes. It
// returns how long the tasks took.
func (c *chaos) run(n int) time.Duration {
	t := c.t
	began := time.Now()
	for _, id := range c.ids {
		c.start(id)
	}
	chaosUntil := time.Now().Add(2 * time.Minute)
	// Chaos goes on past 95 % until it has killed and frozen a worker at
	// least once each, so that a quick run still has both.
	for done := c.b.succeeded(); (done < n*95/100 || c.kills == 0 || c.stops == 0) && done < n && time.Now().Before(chaosUntil); done = c.b.succeeded() {
		// The next strike comes in 1-2 leases, unless every task is done.
		if testutil.WithinEvery(chaosTimeout+rand.N(chaosTimeout), 250*time.Millisecond, func() bool { done = c.b.succeeded(); return done >= n }) {
			break
		}
		if id := c.ids[rand.N(len(c.ids))]; (c.kills+c.stops)%3 != 1 {
			c.kill(id)
		} else {
			c.freeze(id)
		}
	}
	for _, id := range c.ids {
		var ls []string
		for _, k := range c.losses[id] {
			ls = append(ls, k.Format("15:04:05.000"))
		}
		t.Logf("kills and freezes of %s: %v", id, ls)
	}
	done := 0
	if !testutil.WithinEvery(2*time.Minute, 250*time.Millisecond, func() bool { done = c.b.succeeded(); return done >= n }) {
		all, _ := c.b.store.List(context.Background(), task.ListQuery{})
		for _, tk := range all {
			if tk.State != task.StateSucceeded {
				t.Logf("unfinished: %s %s pins %v workers %s", tk.Key, tk.State, tk.SpecificWorkerIDs, fmtWorkers(tk))
			}
		}
		t.Fatalf("only %d of %d tasks succeeded after %d kills, %d freezes and two quiet minutes", done, n, c.kills, c.stops)
	}
	return time.Since(began)
}

// runChaos publishes b.tasks tasks, runs them on four `leasepool worker`
// processes under the chaos loop, and checks, from the store and from the
// run log the programs' forked descendants write: every task succeeded,
// none was lost, no task had more live runs at once than it allows (a
// descendant beating after the next holder started counts as live), no
// lock key had two holders at once, pinned tasks ran only on their pins,
// delayed tasks did not start early, no program ran past its lease, and
// every run a lost worker held was taken over in bounded time. It logs the
// takeover distribution and a summary line.
func runChaos(t *testing.T, ctx context.Context, b chaosBackend) {
	runLog := filepath.Join(t.TempDir(), "run.log")
	c := &chaos{t: t, b: b, ids: []string{"w1", "w2", "w3", "w4"}, workers: map[string]*workerProc{}, losses: map[string][]time.Time{}}
	plan := publishChaos(t, ctx, b.store, b.tasks, c.ids, runLog)
	elapsed := c.run(b.tasks)

	all, err := b.store.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != b.tasks {
		t.Fatalf("store holds %d tasks, published %d", len(all), b.tasks)
	}
	runs := attemptsFromLog(t, readRunLog(t, runLog))
	// A run that logged no end died after the last line it logged (its
	// last beat, or its start when it died before beating).
	resolveUnended(t, runs, "", func(a *attemptRun) (time.Time, bool) { return a.start, true })
	checkStoreAgainstLog(t, all, runs)
	overlaps, overlapTotal, overlapMax := checkOverlapTime(t, runs, plan.allowed)
	checkLockKeys(t, runs, plan.lockKeys)
	// The slack is half a lease: a frozen worker's guard is the one that
	// stops its program, on its own timer, and at load 30 on two cores it
	// has been seen 800ms late (a beat 578ms past lease_until, the next
	// holder starting 560ms after that).
	checkEndedWithinLease(t, all, runs, chaosTimeout/2)
	expired, lostLive := checkChaosEntries(t, all, runs, plan, c.losses)
	takeovers := checkTakeovers(t, all, runs, plan, c.losses)

	p50, p90, p99, mx := percentiles(takeovers)
	t.Logf("%d tasks succeeded in %s with %d kills and %d freezes; %d EXPIRED entries (%d of live processes); %d lost running attempts taken over: p50 %s p90 %s p99 %s max %s",
		b.tasks, elapsed.Round(time.Millisecond), c.kills, c.stops, expired, lostLive, len(takeovers), p50, p90, p99, mx)
	t.Logf("chaos summary (%s): tasks=%d kills=%d stops=%d takeovers=%d max_takeover=%s overlaps=%d overlap_total=%.3fs overlap_max=%.3fs elapsed=%s",
		b.name, b.tasks, c.kills, c.stops, len(takeovers), mx.Round(time.Millisecond), overlaps, overlapTotal.Seconds(), overlapMax.Seconds(), elapsed.Round(time.Second))
	if c.kills == 0 || c.stops == 0 || len(takeovers) == 0 {
		t.Errorf("the chaos loop killed %d times, froze %d times and %d running attempts were taken over: the run was too short to test takeover", c.kills, c.stops, len(takeovers))
	}
}

// checkOverlapTime asserts that no task ever had more runs live at once
// than allowed[key] (a run is live from its start line to its end, or to
// the last line its descendant wrote), and returns how many tasks did,
// the total time they did, and the longest such time of one task.
func checkOverlapTime(t *testing.T, runs map[string][]*attemptRun, allowed map[string]int) (tasks int, total, longest time.Duration) {
	t.Helper()
	for key, as := range runs {
		type edge struct {
			at time.Time
			d  int
		}
		var edges []edge
		for _, a := range as {
			edges = append(edges, edge{a.start, +1}, edge{a.end, -1})
		}
		// Intervals are half open: at equal times an end comes first.
		sort.Slice(edges, func(i, j int) bool {
			return edges[i].at.Before(edges[j].at) || edges[i].at.Equal(edges[j].at) && edges[i].d < edges[j].d
		})
		var over time.Duration
		live := 0
		for i, e := range edges {
			live += e.d
			if live > allowed[key] && i+1 < len(edges) {
				over += edges[i+1].at.Sub(e.at)
			}
		}
		if over <= 0 {
			continue
		}
		tasks++
		total += over
		longest = max(longest, over)
		if tasks <= 10 {
			t.Errorf("task %s: more than %d runs live at once for %s: %s", key, allowed[key], over, fmtRuns(as))
		}
	}
	if tasks > 0 {
		t.Errorf("%d tasks had overlapping live runs for %.3fs in all (longest %.3fs)", tasks, total.Seconds(), longest.Seconds())
	}
	return tasks, total, longest
}

// lostBy returns the first loss of the worker running a, if it came while
// a was running: a ended with no end line at most a beat period and some
// scheduling after it.
func lostBy(losses map[string][]time.Time, a *attemptRun) (time.Time, bool) {
	k, ok := killedBy(losses[a.worker], a.start)
	if !ok || a.ended || k.After(a.end.Add(500*time.Millisecond)) {
		return time.Time{}, false
	}
	return k, true
}

// checkChaosEntries asserts that pinned tasks have entries and runs of
// their pins only and that delayed tasks did not start early, and counts
// EXPIRED entries, and those whose process was neither killed nor frozen
// (a live worker whose renewals fell behind also loses its lease; the
// overlap checks say whether it stopped in time).
func checkChaosEntries(t *testing.T, all []*task.Task, runs map[string][]*attemptRun, plan chaosPlan, losses map[string][]time.Time) (expired, lostLive int) {
	t.Helper()
	for _, tk := range all {
		for _, w := range tk.Attempts {
			if pins := plan.pins[tk.Key]; pins != nil && !slices.Contains(pins, w.WorkerID) {
				t.Errorf("task %s pinned to %v has an entry of %s: %s", tk.Key, pins, w.WorkerID, fmtWorkers(tk))
			}
			if w.State != task.AttemptExpired {
				continue
			}
			expired++
			if k, ok := killedBy(losses[w.WorkerID], w.StartedAt.Add(-100*time.Millisecond)); !ok || k.After(w.LeaseUntil.Add(100*time.Millisecond)) {
				lostLive++
				t.Logf("task %s: attempt %d of %s expired although that process lived: %s", tk.Key, w.Attempt, w.WorkerID, fmtWorkers(tk))
			}
		}
	}
	for key, as := range runs {
		for _, a := range as {
			if pins := plan.pins[key]; pins != nil && !slices.Contains(pins, a.worker) {
				t.Errorf("task %s pinned to %v ran on %s (attempt %d)", key, pins, a.worker, a.attempt)
			}
		}
		if at, ok := plan.runAt[key]; ok && len(as) > 0 && as[0].start.Before(at.Add(-50*time.Millisecond)) {
			t.Errorf("delayed task %s started at %s, before its run_at %s", key, as[0].start.Format(time.StampMicro), at.Local().Format(time.StampMicro))
		}
	}
	return expired, lostLive
}

// checkTakeovers returns, for each attempt a lost (killed or frozen)
// process was running whose entry expired, the next attempt's start minus
// the loss, and asserts each came in reasonable time.
func checkTakeovers(t *testing.T, all []*task.Task, runs map[string][]*attemptRun, plan chaosPlan, losses map[string][]time.Time) []time.Duration {
	t.Helper()
	docs := map[string]*task.Task{}
	for _, tk := range all {
		docs[tk.Key] = tk
	}
	var takeovers []time.Duration
	for key, as := range runs {
		for _, a := range as {
			k, ok := lostBy(losses, a)
			if !ok {
				continue
			}
			// Attempt numbers are unique within a task; the process's
			// instance id is not in the program's log.
			ws := docs[key].Attempts
			if i := slices.IndexFunc(ws, func(w task.Attempt) bool { return w.WorkerID == a.worker && w.Attempt == a.attempt }); i < 0 || ws[i].State != task.AttemptExpired {
				continue // other workers finished the task: nothing to take over
			}
			var next time.Time
			for _, b := range as {
				if b.start.After(k) && (next.IsZero() || b.start.Before(next)) {
					next = b.start
				}
			}
			if next.IsZero() {
				t.Errorf("task %s: attempt %d lost with %s at %s and never taken over: %s", key, a.attempt, a.worker, k.Format(time.StampMicro), fmtRuns(as))
				continue
			}
			takeovers = append(takeovers, next.Sub(k))
			// A task whose lease ran out becomes ready again and then
			// waits, in priority order, behind the backlog of ready tasks
			// when the permitted workers' slots are full (pins narrow that
			// to two workers, and a worker that already succeeded on a
			// multi-worker task may not take it). So the bound only catches
			// a takeover that never came in reasonable time.
			if d := next.Sub(k); d > chaosTimeout+20*time.Second {
				t.Errorf("task %s (pins %v, locks %v): attempt %d lost with %s at %s, taken over only %s later: log %s; store %s", key, plan.pins[key], plan.lockKeys[key],
					a.attempt, a.worker, k.Format(time.StampMicro), d.Round(time.Millisecond), fmtRuns(as), fmtWorkers(docs[key]))
			}
		}
	}
	return takeovers
}
