package tests

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
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
