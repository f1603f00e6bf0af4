package tests

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

// fleetRolloutDevices is the failing rollout's fleet in
// TestFleetRollouts; the healthy one has a fifth as many.
const fleetRolloutDevices = 10_000

// TestFleetRollouts is TestRolloutsOnAFleet at fleet scale, in real
// processes only: fleetRolloutDevices simulated devices (every tenth
// failing but for the rollback, every twentieth away for good, every
// tenth slow) and a fifth as many healthy ones, each fleet a `leasepool
// device simulate` process on a Mosquitto of the test's own, three
// `leasepool worker` processes, the driver's holder SIGKILLed once both
// rollouts are in their second wave. The failing rollout aborts in the
// wave where `failed>8% after 20` is crossed and rolls back exactly the
// devices that succeeded; the healthy one completes every wave in order;
// no rate window is exceeded and no device runs two commands at once.
//
//	LEASEPOOL_TEST_FLEET=1 go test -run TestFleetRollouts -v -timeout 20m ./tests/
func TestFleetRollouts(t *testing.T) {
	needFleet(t)
	testFleetRollouts(t, fleetRolloutDevices, fleetRolloutDevices/5)
}

func testFleetRollouts(t *testing.T, faultyCount, healthyCount int) {
	start := time.Now()
	since := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }
	ctx := testContext(t, 15*time.Minute)
	plainLeasepoolBin(t)
	url := fleetMosquitto(t, faultyCount+healthyCount+16)
	store, storeURL := openTestStore(t, ctx)
	prefix := "fro" + randomSuffix(t)

	var workers []*workerProc
	var logs []string
	for i := range 3 {
		w, log := fleetWorker(t, storeURL, fmt.Sprintf("fro-w%d", i), prefix, fleetConcurrency, "--mqtt", url)
		workers, logs = append(workers, w), append(logs, log)
		if i == 0 {
			eventually(t, 30*time.Second, "fro-w0 to be elected", func() bool {
				holder, err := leaseHolder(t, store, worker.ElectionKey)
				return err == nil && holder == "fro-w0"
			})
		}
	}
	common := []string{"--mqtt", url, "--prefix", prefix, "--heartbeat", "30m", "--attr", "model=pump-x", "--attr", "site=berlin|paris", "--attr", "firmware=1.0"}
	faulty := startSimProc(t, ctx, append(common, "--count", strconv.Itoa(faultyCount), "--id-prefix", "pump-", "--latency", "20ms",
		"--fail-every", "10", "--succeed", "rollback", "--offline-every", "20", "--slow-every", "10", "--slow-latency", "300ms")...)
	healthy := startSimProc(t, ctx, append(common, "--count", strconv.Itoa(healthyCount), "--id-prefix", "valve-", "--latency", "10ms")...)
	t.Logf("%s: %d simulated devices up", since(), faultyCount+healthyCount)

	total := faultyCount + healthyCount
	n := -1
	testutil.EventuallyEvery(t, 5*time.Minute, time.Second, "every device in the inventory", func() bool {
		invs, err := mqttdev.Inventories(ctx, store)
		if len(invs) != n {
			n = len(invs)
			t.Logf("%s: %d devices in the inventory", since(), n)
		}
		return err == nil && len(invs) == total
	})
	invs, err := mqttdev.Inventories(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	for id := range invs {
		labels := mqttdev.Labels{"model": "pump-x", "fleet": "a"}
		if strings.HasPrefix(id, "valve-") {
			labels["fleet"] = "b"
		}
		if _, err := mqttdev.SetLabels(ctx, store, id, mqttdev.LabelChange{Set: labels}); err != nil {
			t.Fatal(err)
		}
		if err := mqttdev.Vouch(ctx, store, id, "operator"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: %d devices labelled and vouched for", since(), total)

	// Rates in proportion to the fleets: the failing rollout aborts in
	// its second wave, the healthy one takes some five seconds a wave.
	rateA, rateB := max(40, faultyCount/25), max(8, healthyCount/5)
	common = []string{"--store", storeURL, "rollout", "create", "--command", "update", "--args", `{"version":"2.0"}`,
		"--waves", "1,10%,50%,100%", "--abort-when", "failed>8% after 20", "--timeout", "5s", "--offline-limit", "2s"}
	if out, errOut, code := runCLI(t, append(common, "fw-a", "--select", "fleet=a,model=pump-x", "--rate", fmt.Sprintf("%d/1s", rateA),
		"--rollback-command", "rollback", "--rollback-args", `{"version":"1.0"}`)...); code != 0 {
		t.Fatalf("rollout create fw-a: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, append(common, "fw-b", "--select", "fleet=b", "--rate", fmt.Sprintf("%d/1s", rateB))...); code != 0 {
		t.Fatalf("rollout create fw-b: exit %d\n%s%s", code, out, errOut)
	}

	pollUntil(t, time.Minute, "both rollouts dispatching their second wave", func() bool {
		a, errA := rollout.Get(ctx, store, "fw-a")
		b, errB := rollout.Get(ctx, store, "fw-b")
		return errA == nil && errB == nil && !a.State.Final() && !b.State.Final() && a.Wave >= 1 && b.Wave >= 1
	})
	holder := driverHolder(t, logs, time.Time{})
	if holder < 0 {
		t.Fatal("no worker logged starting the rollout driver")
	}
	killedAt := workers[holder].kill(t)
	t.Logf("%s: worker %s, the driver, SIGKILLed", since(), workers[holder].id)

	over := func(name string) *rollout.Rollout {
		var r *rollout.Rollout
		pollUntil(t, 5*time.Minute, "rollout "+name+" over", func() bool {
			var err error
			r, err = rollout.Get(ctx, store, name)
			return err == nil && r.State.Final() && (r.Rollback == nil || !r.Rollback.EndedAt.IsZero())
		})
		return r
	}
	a, b := over("fw-a"), over("fw-b")
	t.Logf("%s: fw-a %s in wave %d (%s), fw-b %s", since(), a.State, a.Wave+1, a.Reason, b.State)
	if !killedAt.Before(a.EndedAt) || !killedAt.Before(b.EndedAt) {
		t.Errorf("the worker was killed at %s, after a rollout ended (%s, %s): not mid-rollout", killedAt, a.EndedAt, b.EndedAt)
	}
	if h := driverHolder(t, logs, killedAt); h < 0 || h == holder {
		t.Errorf("no other worker started the driver after %s was killed", workers[holder].id)
	}

	rep := faulty.stop(t)
	hrep := healthy.stop(t)
	rep.Overlaps = append(rep.Overlaps, hrep.Overlaps...)
	checkFleetRollouts(t, a, b, rep, tasksByKey(t, ctx, store), healthyCount)
	pa := a.Progress()
	t.Logf("fw-a: %d succeeded, %d failed, %d offline, %d timed out, %d skipped; fw-b: %d succeeded; %s in all",
		pa.Total.Succeeded, pa.Total.Failed, pa.Total.Offline, pa.Total.TimedOut, pa.Total.Skipped, b.Progress().Total.Succeeded, since())
}

// checkFleetRollouts checks TestRolloutsOnAFleet's invariants on the
// failing rollout a, the healthy rollout b and what the devices saw.
func checkFleetRollouts(t *testing.T, a, b *rollout.Rollout, rep *device.Report, tasks map[string]*task.Task, healthyCount int) {
	t.Helper()
	if len(rep.Overlaps) > 0 {
		t.Errorf("devices ran two commands at once: %+v", rep.Overlaps)
	}
	if a.State != rollout.StateAborted {
		t.Fatalf("fw-a: %s (%s), want aborted; events %+v", a.State, a.Reason, a.Events)
	}
	checkRolloutAbortWave(t, a, a.Spec.AbortWhen[0])
	for _, run := range rep.Runs {
		if run.Command == "update" && run.SentAt.After(a.EndedAt) {
			t.Errorf("%s ran update (%s attempt %d) sent at %s, after the abort was recorded at %s", run.Device, run.TaskKey, run.Attempt, run.SentAt, a.EndedAt)
		}
	}
	for key, tk := range tasks {
		if !strings.HasPrefix(key, "rollout:fw-a:") || strings.HasSuffix(key, ":rollback") {
			continue
		}
		for _, w := range append(slices.Clone(tk.History), tk.Attempts...) {
			if w.StartedAt.After(a.EndedAt) {
				t.Errorf("%s claimed at %s, after the abort was recorded at %s", key, w.StartedAt, a.EndedAt)
			}
		}
	}
	var succeeded, rolledBack []string
	for _, e := range a.Devices {
		if e.Outcome == rollout.OutcomeSucceeded {
			succeeded = append(succeeded, e.Device)
		}
	}
	okUpdate := map[string]bool{}
	for _, run := range rep.Runs {
		if run.Command == "rollback" && !slices.Contains(rolledBack, run.Device) {
			rolledBack = append(rolledBack, run.Device)
		}
		if run.Command == "update" && run.OK {
			okUpdate[run.Device] = true
		}
	}
	slices.Sort(succeeded)
	slices.Sort(rolledBack)
	if len(succeeded) == 0 || !slices.Equal(succeeded, rolledBack) {
		t.Errorf("rollback ran on %v\nthe devices that succeeded: %v", rolledBack, succeeded)
	}
	for _, d := range succeeded {
		if !okUpdate[d] {
			t.Errorf("%s counted succeeded, but the device never ran update successfully", d)
		}
	}
	if b.State != rollout.StateCompleted {
		t.Fatalf("fw-b: %s (%s), want completed; events %+v", b.State, b.Reason, b.Events)
	}
	var started []int
	for _, e := range b.Events {
		if e.Type == rollout.EventWaveStarted {
			started = append(started, e.Wave)
		}
	}
	if fmt.Sprint(started) != "[0 1 2 3]" {
		t.Errorf("fw-b waves started %v, want [0 1 2 3]", started)
	}
	for i := 1; i < len(b.Waves); i++ {
		if b.Waves[i].StartedAt.Before(b.Waves[i-1].EndedAt) {
			t.Errorf("fw-b wave %d started before wave %d ended", i+1, i)
		}
	}
	if p := b.Progress(); p.Total.Succeeded != healthyCount {
		t.Errorf("fw-b: %+v, want %d succeeded", p.Total, healthyCount)
	}
	for _, r := range []*rollout.Rollout{a, b} {
		var at []time.Time
		for _, e := range r.Devices {
			at = append(at, e.Dispatched...)
			for n := 1; n <= e.Attempt && n <= len(e.Dispatched); n++ {
				if tk := tasks[rollout.TaskKey(r.Name, e.Device, n)]; tk != nil && tk.CreatedAt.Before(e.Dispatched[0]) {
					t.Errorf("%s created at %s, before its first dispatch %s", tk.Key, tk.CreatedAt, e.Dispatched[0])
				}
			}
		}
		slices.SortFunc(at, time.Time.Compare)
		rate := r.Spec.Rate
		for i := rate.N; i < len(at); i++ {
			if at[i].Sub(at[i-rate.N]) < time.Duration(rate.Per) {
				t.Errorf("%s: %d dispatches within %s: %s .. %s", r.Name, rate.N+1, time.Duration(rate.Per), at[i-rate.N], at[i])
				break
			}
		}
	}
}
