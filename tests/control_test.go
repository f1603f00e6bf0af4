package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// flowStore opens a fresh embedded store; it returns the store and its URL.
func flowStore(t *testing.T, ctx context.Context) (*sqlitestore.Store, string) {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "store.db")
	st, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, "sqlite:" + dbPath
}

// startWorkers starts three worker processes of the built-in kinds but
// devices (no MQTT) on url.
func startWorkers(t *testing.T, url string) {
	t.Helper()
	for i := range 3 {
		startWorker(t, url, fmt.Sprintf("w%d", i+1), "--concurrency", "4", "--kinds", "noop,sleep")
	}
}

// starts returns every attempt's start time (store time), sorted, and by
// task.
func starts(t *testing.T, ctx context.Context, st task.Store) (all []time.Time, byTask map[string][]time.Time) {
	t.Helper()
	ts, err := st.List(ctx, task.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	byTask = map[string][]time.Time{}
	for _, tk := range ts {
		for _, w := range tk.Attempts {
			all = append(all, w.StartedAt)
			byTask[tk.Key] = append(byTask[tk.Key], w.StartedAt)
		}
	}
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	return all, byTask
}

func countTasks(t *testing.T, ctx context.Context, st task.Store, state task.State) int {
	t.Helper()
	ts, err := st.List(ctx, task.ListQuery{State: state})
	if err != nil {
		t.Fatal(err)
	}
	return len(ts)
}

// TestPauseAllStopsStartsAcrossProcesses runs a stream of short sleep tasks
// on three worker processes, pauses everything and measures, in store
// time, from just before the pause write to the last start after it; then
// checks that nothing starts while paused, that what ran finished, and
// that resume restarts the rest at once.
func TestPauseAllStopsStartsAcrossProcesses(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	st, url := flowStore(t, ctx)
	// 12 slots start about 40 tasks a second: several would start within
	// any lag worth reporting.
	const n = 150
	for i := range n {
		p := task.PublishParams{Key: fmt.Sprintf("s%03d", i), Kind: "sleep", Payload: json.RawMessage(`{"duration":"300ms"}`)}
		if _, _, err := task.Publish(ctx, st, p); err != nil {
			t.Fatal(err)
		}
	}
	startWorkers(t, url)
	eventually(t, time.Minute, "24 tasks to finish", func() bool { return countTasks(t, ctx, st, task.StateSucceeded) >= 24 })

	callAt := st.Now()
	if _, err := control.Pause(ctx, st, control.All()); err != nil {
		t.Fatal(err)
	}
	returned := st.Now()
	// The pause takes effect with the doorbell write (its change event is
	// what workers act on): its store time is when the pause was written.
	bell, err := st.GetDocument(ctx, control.DoorbellNamespace, control.DoorbellID)
	if err != nil {
		t.Fatal(err)
	}
	pauseAt := bell.UpdatedAt
	// Claims in flight at the pause land: the starts come to rest.
	testutil.SettlesEvery(t, 30*time.Second, time.Second, 20*time.Millisecond, "the claims in flight at the pause to land", func() int64 {
		all, _ := starts(t, ctx, st)
		return int64(len(all))
	})
	// The tasks running at the pause finish (300 ms, then their outcome's
	// write, which a loaded machine delays): read the starts after that.
	eventually(t, 30*time.Second, "the running tasks to finish after the pause", func() bool {
		return countTasks(t, ctx, st, task.StateRunning) == 0
	})
	all, _ := starts(t, ctx, st)
	last := all[len(all)-1]
	lag := last.Sub(pauseAt)
	late := 0
	for _, s := range all {
		if s.After(pauseAt) {
			late++
		}
	}
	t.Logf("pause: the Pause call took %s (its doorbell write landed %s in); last start %s after the write (%d starts after it), %s after the call began",
		returned.Sub(callAt).Round(time.Millisecond), pauseAt.Sub(callAt).Round(time.Millisecond),
		lag.Round(time.Millisecond), late, last.Sub(callAt).Round(time.Millisecond))
	// The aim is 100 ms; a busy 2-core machine running three race-built
	// workers gets headroom.
	if lag > 300*time.Millisecond {
		t.Errorf("a task started %s after the pause was written, want well under 300ms", lag)
	}
	pending := countTasks(t, ctx, st, task.StatePending)
	if pending == 0 {
		t.Fatal("nothing left pending: the test proves nothing about resume")
	}
	consistently(t, 500*time.Millisecond, "no task started while everything is paused", func() bool {
		again, _ := starts(t, ctx, st)
		return len(again) == len(all)
	})

	resumeAt := st.Now()
	if _, err := control.Resume(ctx, st, control.All()); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "every task to finish after resume", func() bool { return countTasks(t, ctx, st, task.StateSucceeded) == n })
	after, byTask := starts(t, ctx, st)
	first := after[len(all)]
	t.Logf("resume: first start %s after the resume write began; %d tasks were held", first.Sub(resumeAt).Round(time.Millisecond), pending)
	if d := first.Sub(resumeAt); d > time.Second {
		t.Errorf("first start %s after resume, want at once", d)
	}
	for key, ss := range byTask {
		if len(ss) != 1 {
			t.Errorf("task %s started %d times, want once", key, len(ss))
		}
	}
}

// TestDeviceRateLimitAcrossProcesses sets a default limit of 2 commands per
// second for every device with the CLI, runs tasks on two devices on three
// worker processes, and checks every device's start times pairwise: no
// window of 1 s holds more than 2, none spent an attempt waiting, and the
// limit paces them rather than starving them.
func TestDeviceRateLimitAcrossProcesses(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	st, url := flowStore(t, ctx)
	if out, errOut, code := runCLI(t, "--store", url, "limit", "set", "device:*", "--rate", "2/1s"); code != 0 || !strings.Contains(out, "2/1s") {
		t.Fatalf("limit set: exit %d, %s %s", code, out, errOut)
	}
	const perDevice = 7
	devices := []string{"cam-1", "cam-2"}
	for i := range perDevice {
		for _, d := range devices {
			p := task.PublishParams{Key: fmt.Sprintf("%s-%d", d, i), Kind: "noop", Options: task.Options{LockKeys: []string{"device:" + d}}}
			if _, _, err := task.Publish(ctx, st, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	startWorkers(t, url)
	eventually(t, time.Minute, "every command to finish", func() bool {
		return countTasks(t, ctx, st, task.StateSucceeded) == perDevice*len(devices)
	})
	_, byTask := starts(t, ctx, st)
	for _, d := range devices {
		var ts []time.Time
		for i := range perDevice {
			ss := byTask[fmt.Sprintf("%s-%d", d, i)]
			if len(ss) != 1 {
				t.Errorf("%s-%d started %d times: waiting for the limit must not spend attempts", d, i, len(ss))
			}
			ts = append(ts, ss...)
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		minGap := time.Hour
		for i := range ts {
			for j := i + 2; j < len(ts); j++ { // pairwise: i, j and one between
				if gap := ts[j].Sub(ts[i]); gap < time.Second {
					t.Errorf("device %s: starts %d..%d (3 or more) within %s", d, i, j, gap)
				}
			}
			if i >= 2 {
				minGap = min(minGap, ts[i].Sub(ts[i-2]))
			}
		}
		span := ts[len(ts)-1].Sub(ts[0])
		t.Logf("device %s: %d starts over %s; tightest window of 3 starts %s", d, len(ts), span.Round(time.Millisecond), minGap.Round(time.Millisecond))
		if span > time.Duration(perDevice/2)*time.Second+3*time.Second {
			t.Errorf("device %s: %d starts took %s at 2/s: the limit starves them", d, len(ts), span)
		}
	}
	if out, _, code := runCLI(t, "--store", url, "limit", "ls", "--json"); code != 0 || !strings.Contains(out, `"device:*"`) {
		t.Errorf("limit ls: exit %d, %s", code, out)
	}
}

// TestMongoPauseAndLimit runs the controls on MongoDB (the wire test
// server) with two worker processes: a kind paused with the CLI holds its
// tasks, resume starts them at once, and a kind limit of 2 per second holds.
func TestMongoPauseAndLimit(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	uri := sharedMongoDB(t)
	st := openMongoStore(t, ctx, uri, nil)
	if _, _, code := runCLI(t, "--store", uri, "pause", "--kind", "noop"); code != 0 {
		t.Fatalf("pause: exit %d", code)
	}
	for i := range 2 {
		startWorker(t, uri, fmt.Sprintf("m%d", i+1), "--concurrency", "4", "--kinds", "noop,sleep")
	}
	const n = 6
	for i := range n {
		if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: fmt.Sprintf("n%d", i), Kind: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	consistently(t, 1500*time.Millisecond, fmt.Sprintf("all %d tasks pending while their kind is paused", n),
		func() bool { return countTasks(t, ctx, st, task.StatePending) == n })
	if out, _, code := runCLI(t, "--store", uri, "limit", "set", "--kind", "noop", "--rate", "2/1s"); code != 0 || !strings.Contains(out, "2/1s") {
		t.Fatalf("limit set: exit %d, %s", code, out)
	}
	resumeAt := st.Now()
	if _, _, code := runCLI(t, "--store", uri, "resume", "--kind", "noop"); code != 0 {
		t.Fatalf("resume: exit %d", code)
	}
	eventually(t, time.Minute, "every task to finish", func() bool { return countTasks(t, ctx, st, task.StateSucceeded) == n })
	all, byTask := starts(t, ctx, st)
	t.Logf("mongo: first start %s after the resume command began (a CLI process); %d starts over %s",
		all[0].Sub(resumeAt).Round(time.Millisecond), len(all), all[len(all)-1].Sub(all[0]).Round(time.Millisecond))
	if d := all[0].Sub(resumeAt); d > 5*time.Second {
		t.Errorf("first start %s after resume: the doorbell event did not wake the workers", d)
	}
	for i := 2; i < len(all); i++ {
		if gap := all[i].Sub(all[i-2]); gap < time.Second {
			t.Errorf("starts %d and %d within %s: 3 starts in 1 s, limit 2", i-2, i, gap)
		}
	}
	for k, ss := range byTask {
		if len(ss) != 1 {
			t.Errorf("%s started %d times", k, len(ss))
		}
	}
}
