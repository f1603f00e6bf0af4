package tests

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

var mongoDBSeq atomic.Int64

// mongoDBURI returns base (mongodb://HOST:PORT/?directConnection=true) with
// a database name of its own in the path, fresh for every call, so tests
// sharing one server never see each other's tasks.
func mongoDBURI(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("mongo uri %q: %v", base, err)
	}
	name := regexp.MustCompile(`[^A-Za-z0-9]`).ReplaceAllString(strings.TrimPrefix(t.Name(), "TestMongo"), "")
	if len(name) > 20 {
		name = name[:20]
	}
	u.Path = fmt.Sprintf("/lp_%s_%d_%d", name, time.Now().UnixNano()%1_000_000_000, mongoDBSeq.Add(1))
	return u.String()
}

// sharedMongoDB is a fresh database on the shared wire test server (fails
// t when the server is not configured).
func sharedMongoDB(t *testing.T) string {
	t.Helper()
	return mongoDBURI(t, testservers.MongoURI(t))
}

// openMongoStore opens the store at uri and closes it when t ends.
func openMongoStore(t *testing.T, ctx context.Context, uri string, cfg *mongostore.Config) *mongostore.Store {
	t.Helper()
	s, err := mongostore.Open(ctx, uri, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", uri, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// countState counts the tasks in state st (a server-side count).
func countState(t *testing.T, ctx context.Context, s *mongostore.Store, st task.State) int {
	t.Helper()
	n, err := s.Database().Collection(mongostore.TasksCollection).CountDocuments(ctx, bson.D{
		{Key: "state", Value: string(st)},
	})
	if err != nil {
		t.Fatalf("count %s: %v", st, err)
	}
	return int(n)
}

// watchedExecPayload is execPayload plus a watcher in a session of its own
// (so neither the process-group kill on cancel nor the worker's death
// reaches it) that logs a "gone" line as soon as the program dies: it
// reads a FIFO whose only writer is the program's shell (sleep gets it
// closed), and EOF comes when that shell's descriptors close at death. An
// attempt cancelled or killed mid-run thus still shows when it really
// stopped. (Polling the pid would not do: the shell of a killed worker is
// a zombie until init reaps it, which here takes a second or two.)
func watchedExecPayload(logPath string, sleep time.Duration) string {
	line := func(ev string) string {
		return fmt.Sprintf(`"$LEASEPOOL_TASK_KEY $LEASEPOOL_ATTEMPT $LEASEPOOL_WORKER_ID %s $(date +%%s%%N)" >> %s`, ev, logPath)
	}
	script := fmt.Sprintf(`f=$(mktemp -u); mkfifo "$f"; setsid sh -c 'cat "$0" >/dev/null; rm -f "$0"; echo %s' "$f" </dev/null >/dev/null 2>&1 & exec 3>"$f"
echo %s; sleep %f 3>&-; echo %s`, line("gone"), line("start"), sleep.Seconds(), line("end"))
	return fmt.Sprintf(`{"argv":["sh","-c",%q]}`, script)
}

// attemptRun is one attempt as the run log shows it. ended says the
// program wrote its end line; otherwise end is its gone time, or filled in
// by resolveUnended.
type attemptRun struct {
	key, worker string
	attempt     int
	pid         int // of the process that logged its start, if logged
	start, end  time.Time
	started     bool
	ended       bool // the program logged its end line
	// gone is when the program was last known alive: when its watcher saw
	// it die, or its last heartbeat.
	gone time.Time
}

// attemptsFromLog groups the run log by task and attempt, sorted by start.
// It reports attempt numbers logged by two workers (they must be unique).
func attemptsFromLog(t *testing.T, lines []logLine) map[string][]*attemptRun {
	t.Helper()
	byKey := map[string]map[int]*attemptRun{}
	for _, l := range lines {
		if byKey[l.key] == nil {
			byKey[l.key] = map[int]*attemptRun{}
		}
		a := byKey[l.key][l.attempt]
		if a == nil {
			a = &attemptRun{key: l.key, worker: l.worker, attempt: l.attempt}
			byKey[l.key][l.attempt] = a
		}
		if a.worker != l.worker {
			t.Errorf("task %s attempt %d logged by two workers %s and %s: attempt numbers must be unique", l.key, l.attempt, a.worker, l.worker)
		}
		switch l.event {
		case "start":
			if a.started {
				t.Errorf("task %s attempt %d started twice", l.key, l.attempt)
			}
			a.start, a.started, a.pid = l.at, true, l.pid
		case "beat":
			if l.at.After(a.gone) {
				a.gone = l.at
			}
		case "end":
			a.end, a.ended = l.at, true
		case "gone":
			a.gone = l.at
		default:
			t.Errorf("run log: unknown event %q", l.event)
		}
	}
	out := map[string][]*attemptRun{}
	for key, m := range byKey {
		for _, a := range m {
			if !a.ended && !a.gone.IsZero() {
				a.end = a.gone // cancelled or killed: it ran until then
			}
			if !a.started {
				if a.ended {
					t.Errorf("task %s attempt %d on %s: end line without a start line", key, a.attempt, a.worker)
				}
				continue // died before its start line: it did nothing
			}
			out[key] = append(out[key], a)
		}
		sort.Slice(out[key], func(i, j int) bool { return out[key][i].start.Before(out[key][j].start) })
	}
	return out
}

// resolveUnended gives every attempt with neither an end nor a gone line the end that
// resolve returns (for example its worker's kill time); resolve returning
// false is an error: a handler that should have ended did not.
func resolveUnended(t *testing.T, runs map[string][]*attemptRun, why string, resolve func(a *attemptRun) (time.Time, bool)) {
	t.Helper()
	for _, as := range runs {
		for _, a := range as {
			if a.ended || !a.gone.IsZero() {
				continue
			}
			end, ok := resolve(a)
			if !ok {
				t.Errorf("task %s attempt %d on %s (started %s) never ended, and %s", a.key, a.attempt, a.worker, a.start.Format(time.StampMicro), why)
				a.end = a.start
				continue
			}
			a.end = end
		}
	}
}

// killedBy returns the first of kills (sorted) at or after start.
func killedBy(kills []time.Time, start time.Time) (time.Time, bool) {
	for _, k := range kills {
		if !k.Before(start) {
			return k, true
		}
	}
	return time.Time{}, false
}

// checkLiveAttempts asserts no task had more attempts running at once than
// allowed[key]. Intervals are half open: [start, end).
func checkLiveAttempts(t *testing.T, runs map[string][]*attemptRun, allowed map[string]int) {
	t.Helper()
	for key, as := range runs {
		for _, a := range as {
			n := 0
			for _, b := range as {
				if !b.start.After(a.start) && b.end.After(a.start) {
					n++
				}
			}
			if n > allowed[key] {
				t.Errorf("task %s: %d attempts live at once at %s, allowed %d: %s", key, n, a.start.Format(time.StampMicro), allowed[key], fmtRuns(as))
			}
		}
	}
}

// checkLockKeys asserts that no two attempts of tasks sharing a lock key
// ran at the same time.
func checkLockKeys(t *testing.T, runs map[string][]*attemptRun, lockKeys map[string][]string) {
	t.Helper()
	byLock := map[string][]*attemptRun{}
	for key, locks := range lockKeys {
		for _, l := range locks {
			byLock[l] = append(byLock[l], runs[key]...)
		}
	}
	for l, as := range byLock {
		sort.Slice(as, func(i, j int) bool { return as[i].start.Before(as[j].start) })
		var prev *attemptRun
		for _, a := range as {
			if prev != nil && a.start.Before(prev.end) {
				t.Errorf("lock %s held twice at once: %s attempt %d on %s [%s, %s) and %s attempt %d on %s [%s, %s)", l,
					prev.key, prev.attempt, prev.worker, prev.start.Format(time.StampMicro), prev.end.Format(time.StampMicro),
					a.key, a.attempt, a.worker, a.start.Format(time.StampMicro), a.end.Format(time.StampMicro))
			}
			if prev == nil || a.end.After(prev.end) {
				prev = a
			}
		}
	}
}

func fmtRuns(as []*attemptRun) string {
	var b strings.Builder
	for _, a := range as {
		fmt.Fprintf(&b, "[#%d %s %s..%s ended=%v", a.attempt, a.worker, a.start.Format("15:04:05.000000"), a.end.Format("15:04:05.000000"), a.ended)
		if a.pid != 0 {
			fmt.Fprintf(&b, " pid %d", a.pid)
		}
		b.WriteString("] ")
	}
	return b.String()
}

// checkStoreAgainstLog asserts that every task in the store succeeded, and
// that each SUCCESS entry is an attempt whose program ran to its end line
// on that worker (so no success is recorded for work that did not happen).
func checkStoreAgainstLog(t *testing.T, all []*task.Task, runs map[string][]*attemptRun) {
	t.Helper()
	for _, tk := range all {
		if tk.State != task.StateSucceeded {
			t.Errorf("task %s ended %s: %s", tk.Key, tk.State, fmtWorkers(tk))
			continue
		}
		last, successes := 0, 0
		for _, w := range tk.Attempts {
			if w.Attempt <= last {
				t.Errorf("task %s: attempt numbers do not grow: %s", tk.Key, fmtWorkers(tk))
			}
			last = w.Attempt
			if w.State != task.AttemptSuccess {
				continue
			}
			successes++
			i := slices.IndexFunc(runs[tk.Key], func(a *attemptRun) bool { return a.attempt == w.Attempt })
			switch {
			case i < 0:
				t.Errorf("task %s: attempt %d on %s recorded SUCCESS but its program never ran", tk.Key, w.Attempt, w.WorkerID)
			case !runs[tk.Key][i].ended || runs[tk.Key][i].worker != w.WorkerID:
				t.Errorf("task %s: attempt %d recorded SUCCESS on %s, but the log shows %+v", tk.Key, w.Attempt, w.WorkerID, *runs[tk.Key][i])
			}
		}
		if successes < tk.SuccessWorkerCnt {
			t.Errorf("task %s: %d successes, wants %d: %s", tk.Key, successes, tk.SuccessWorkerCnt, fmtWorkers(tk))
		}
	}
}

// checkEndedWithinLease asserts that no program ran past its lease: an
// attempt whose end (or death) is later than its entry's last lease_until (plus
// slack for the cancellation to reach the program) should have been
// cancelled when the lease certainly expired, and any peer could have run
// the task meanwhile.
func checkEndedWithinLease(t *testing.T, all []*task.Task, runs map[string][]*attemptRun, slack time.Duration) {
	t.Helper()
	for _, tk := range all {
		for _, w := range tk.Attempts {
			i := slices.IndexFunc(runs[tk.Key], func(a *attemptRun) bool { return a.attempt == w.Attempt })
			if i < 0 || (!runs[tk.Key][i].ended && runs[tk.Key][i].gone.IsZero()) {
				continue
			}
			if a := runs[tk.Key][i]; a.end.After(w.LeaseUntil.Add(slack)) {
				t.Errorf("task %s attempt %d on %s ran until %s, %s past its lease (%s): it was not cancelled when the lease expired; store: %s",
					tk.Key, w.Attempt, w.WorkerID, a.end.Format(time.StampMicro), a.end.Sub(w.LeaseUntil).Round(time.Millisecond),
					w.LeaseUntil.Local().Format(time.StampMicro), fmtWorkers(tk))
			}
		}
	}
}

func fmtWorkers(tk *task.Task) string {
	var b strings.Builder
	for _, w := range tk.Attempts {
		fmt.Fprintf(&b, "[#%d %s %s %s..%s lease %s %s] ", w.Attempt, w.WorkerID, w.State,
			w.StartedAt.Local().Format("15:04:05.000"), w.EndedAt.Local().Format("15:04:05.000"), w.LeaseUntil.Local().Format("15:04:05.000"), w.Error)
	}
	return b.String()
}

// percentiles returns p50, p90, p99 and max of ds (nearest rank).
func percentiles(ds []time.Duration) (p50, p90, p99, mx time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return at(0.50), at(0.90), at(0.99), s[len(s)-1]
}
