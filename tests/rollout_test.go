package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
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

// healthyCount is the size of the healthy fleet.
const healthyCount = 40

// TestRolloutsOnAFleet runs two rollouts at once on Mosquitto through
// three `leasepool worker` processes, one SIGKILLed mid-rollout (the
// elected one, which runs the driver; another is elected and takes it
// over):
//
//   - on 200 simulated devices (every tenth failing, every twentieth
//     offline, every tenth slow), waves 1, 10%, 50%, 100% with
//     `failed>8% after 20` abort in the wave where the threshold is
//     crossed; no device gets the command after the abort is recorded;
//     the rollback runs on exactly the devices that succeeded;
//   - on 40 healthy devices, every wave completes in order.
//
// For both, the rate is never exceeded in any window and no device ever
// runs two commands at once.
func TestRolloutsOnAFleet(t *testing.T) {
	start := time.Now()
	ctx := testContext(t, 4*time.Minute)
	leasepoolBin(t) // build before the clock matters
	url := sharedBroker(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "ro" + randomSuffix(t)

	// The workers start first, so the statuses (each a store write per
	// worker) come in while the devices connect.
	var workers []*workerProc
	var logs []string
	for i := range 3 {
		w, log := startDeviceWorker(t, storeURL, fmt.Sprintf("ro-w%d", i), prefix, "--mqtt", url)
		workers, logs = append(workers, w), append(logs, log)
		if i == 0 { // the first is elected
			eventually(t, 30*time.Second, "ro-w0 to be elected", func() bool {
				holder, err := leaseHolder(t, store, worker.ElectionKey)
				return err == nil && holder == "ro-w0"
			})
		}
	}
	sites := []string{"berlin", "paris"}
	attrs := func(fleet string) func(int, string) mqttdev.Labels {
		return func(i int, _ string) mqttdev.Labels {
			return mqttdev.Labels{"model": "pump-x", "site": sites[i%2], "fleet": fleet, "firmware": "1.0"}
		}
	}
	// Heartbeats are slow: every status a worker hears is a store write.
	faulty := startSim(t, ctx, device.Config{BrokerURL: url, Prefix: prefix, Count: 200, IDPrefix: "pump-", Latency: 20 * time.Millisecond,
		Heartbeat: time.Minute, Attributes: attrs("a"),
		Behavior: func(i int) device.Behavior {
			return device.Behavior{Fail: i%10 == 9, Succeed: []string{"rollback"}, Offline: i%20 == 0, Latency: map[bool]time.Duration{true: 300 * time.Millisecond}[i%10 == 1]}
		}})
	healthy := startSim(t, ctx, device.Config{BrokerURL: url, Prefix: prefix, Count: healthyCount, IDPrefix: "valve-", Latency: 10 * time.Millisecond,
		Heartbeat: time.Minute, Attributes: attrs("b")})
	t.Logf("%s: %d simulated devices connected", time.Since(start).Round(time.Millisecond), 200+healthyCount)

	n := 0
	pollUntil(t, 90*time.Second, "every device in the inventory", func() bool {
		invs, err := mqttdev.Inventories(ctx, store)
		if len(invs) != n {
			n = len(invs)
			t.Logf("%s: %d devices in the inventory", time.Since(start).Round(time.Millisecond), n)
		}
		return err == nil && len(invs) == 200+healthyCount
	})
	t.Logf("%s: inventory complete", time.Since(start).Round(time.Millisecond))
	// Rollouts select by the operator's labels, not by what the devices
	// announce, and only devices vouched for: the operator labels each
	// fleet and approves it.
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

	common := []string{"--store", storeURL, "rollout", "create", "--command", "update", "--args", `{"version":"2.0"}`,
		"--waves", "1,10%,50%,100%", "--abort-when", "failed>8% after 20", "--timeout", "5s", "--offline-limit", "2s"}
	if out, errOut, code := runCLI(t, append(common, "fw-a", "--select", "fleet=a,model=pump-x", "--rate", "40/1s",
		"--rollback-command", "rollback", "--rollback-args", `{"version":"1.0"}`)...); code != 0 {
		t.Fatalf("rollout create fw-a: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, append(common, "fw-b", "--select", "fleet=b", "--rate", "8/1s")...); code != 0 {
		t.Fatalf("rollout create fw-b: exit %d\n%s%s", code, out, errOut)
	}

	// SIGKILL the first worker once both rollouts are under way.
	pollUntil(t, 30*time.Second, "both rollouts dispatching their second wave", func() bool {
		a, errA := rollout.Get(ctx, store, "fw-a")
		b, errB := rollout.Get(ctx, store, "fw-b")
		return errA == nil && errB == nil && !a.State.Final() && !b.State.Final() &&
			a.Progress().Total.Running+a.Progress().Total.Ended() >= 8 && b.Progress().Total.Running+b.Progress().Total.Ended() >= 8
	})
	// Kill the driver: the worker last elected.
	holder := driverHolder(t, logs, time.Time{})
	if holder < 0 {
		t.Fatal("no worker logged starting the rollout driver")
	}
	killedAt := workers[holder].kill(t)
	t.Logf("%s: worker %s, the driver, SIGKILLed", time.Since(start).Round(time.Millisecond), workers[holder].id)

	over := func(name string) *rollout.Rollout {
		var r *rollout.Rollout
		pollUntil(t, 120*time.Second, "rollout "+name+" over", func() bool {
			var err error
			r, err = rollout.Get(ctx, store, name)
			return err == nil && r.State.Final() && (r.Rollback == nil || !r.Rollback.EndedAt.IsZero())
		})
		return r
	}
	a, b := over("fw-a"), over("fw-b")
	t.Logf("%s: fw-a %s in wave %d (%s), fw-b %s", time.Since(start).Round(time.Millisecond), a.State, a.Wave+1, a.Reason, b.State)
	if !killedAt.Before(a.EndedAt) || !killedAt.Before(b.EndedAt) {
		t.Errorf("the worker was killed at %s, after a rollout ended (%s, %s): not mid-rollout", killedAt, a.EndedAt, b.EndedAt)
	}

	if h := driverHolder(t, logs, killedAt); h < 0 || h == holder {
		t.Errorf("no other worker started the driver after %s was killed", workers[holder].id)
	}

	rep := faulty.Report()
	rep.Overlaps = append(rep.Overlaps, healthy.Report().Overlaps...)
	succeeded := checkFleetRollouts(t, a, b, rep, tasksByKey(t, ctx, store), healthyCount)

	// The CLI reads what the driver wrote.
	out, _, code := runCLI(t, "--store", storeURL, "rollout", "show", "fw-a", "--json")
	var p rollout.Progress
	if err := json.Unmarshal([]byte(out), &p); code != 0 || err != nil || p.State != rollout.StateAborted || p.RolledBack.Succeeded != len(succeeded) {
		t.Errorf("rollout show fw-a: exit %d, %v, %+v", code, err, p)
	}
	pa := a.Progress()
	t.Logf("fw-a: %d succeeded, %d failed, %d offline, %d timed out, %d cancelled, %d skipped; %d rolled back; fw-b: %d succeeded; %s in all",
		pa.Total.Succeeded, pa.Total.Failed, pa.Total.Offline, pa.Total.TimedOut, pa.Total.Cancelled, pa.Total.Skipped, len(succeeded),
		b.Progress().Total.Succeeded, time.Since(start).Round(time.Millisecond))
}

// checkRolloutAbortWave checks that r aborted in the wave where rule was
// crossed: it had not held when any earlier wave ended, and no later wave
// started or had a device sent anything.
func checkRolloutAbortWave(t *testing.T, r *rollout.Rollout, rule rollout.AbortRule) {
	t.Helper()
	var failed, ended int
	for w := 0; w < r.Wave; w++ {
		for _, e := range r.Devices[r.Waves[w].Start:r.Waves[w].End] {
			if e.Outcome == rollout.OutcomeSucceeded || e.Outcome.Failure() {
				ended++
			}
			if slices.Contains(rule.Kinds, e.Outcome) {
				failed++
			}
		}
		if r.Waves[w].EndedAt.IsZero() {
			t.Errorf("wave %d never ended, yet wave %d ran", w+1, r.Wave+1)
		}
		if ended >= rule.After && 100*float64(failed)/float64(ended) > rule.Percent {
			t.Errorf("%s held at the end of wave %d (%d of %d), yet the rollout ran on to wave %d", rule, w+1, failed, ended, r.Wave+1)
		}
	}
	for w := r.Wave + 1; w < len(r.Waves); w++ {
		if !r.Waves[w].StartedAt.IsZero() {
			t.Errorf("wave %d started after the abort in wave %d", w+1, r.Wave+1)
		}
	}
	for _, e := range r.Devices[r.Waves[r.Wave].End:] {
		if len(e.Dispatched) > 0 {
			t.Errorf("%s of a wave after the abort was dispatched", e.Device)
		}
	}
	if !strings.Contains(r.Reason, rule.String()) {
		t.Errorf("abort reason %q does not name the rule %s", r.Reason, rule)
	}

}

// pollUntil is eventually at a slower pace: each poll here reads hundreds
// of documents, and the store is what the workers share.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, d, 250*time.Millisecond, what, cond)
}

// driverHolder returns the index of the worker whose log last says it
// was elected and started the rollout driver after since, or -1.
func driverHolder(t *testing.T, logs []string, since time.Time) int {
	t.Helper()
	holder, at := -1, since
	for i, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, `"elected: duties started"`) || !strings.Contains(line, `"rollout driver"`) {
				continue
			}
			var l struct{ Time time.Time }
			if json.Unmarshal([]byte(line), &l) == nil && l.Time.After(at) {
				holder, at = i, l.Time
			}
		}
	}
	return holder
}

// checkFleetRollouts checks TestRolloutsOnAFleet's invariants on the
// failing rollout a, the healthy rollout b and what the devices saw, and
// returns the devices of a that succeeded (and were rolled back).
func checkFleetRollouts(t *testing.T, a, b *rollout.Rollout, rep *device.Report, tasks map[string]*task.Task, healthyCount int) (succeeded []string) {
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
	var rolledBack []string
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
	return succeeded
}
