package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// The fleet: fleetDevices simulated devices on a Mosquitto of the test's
// own, in two simulator processes: the first fleetDevices-fleetAway
// devices, and fleetAway devices (10 %) that go away at once as soon as
// they are up and stay away for fleetOutage.
const (
	fleetDevices = 10_000
	fleetAway    = fleetDevices / 10
	fleetOutage  = 60 * time.Second
	// fleetReturn spreads the returns of the devices away: a thousand
	// back in the same millisecond would queue for the workers' handlers
	// (192 in all), and what is measured is each one's wake-up.
	fleetReturn = 5 * time.Second
	// fleetResumeBound is the latest a command may start after its
	// device's return. Each starts within a second on a machine with
	// room to spare (max 231–700 ms); on a two-core machine running two
	// dozen other processes the slowest took 3.6 s, the store's writer
	// busy with the returns' state writes. A wake-up missed would wait
	// for the workers' fallback look (HandlerConfig.OfflineRecheck, 30 s).
	fleetResumeBound = 5 * time.Second
	// fleetWatch is how long the store's writes are counted while the
	// fleetAway devices are away with a command waiting for each.
	fleetWatch = 30 * time.Second
	// fleetLatency is how long each command runs on its device.
	fleetLatency = 30 * time.Millisecond
	// fleetConcurrency is each worker's handlers: with 30 ms commands and
	// a store round trip or two around each, 500 commands a second need
	// some 50 in flight across the three workers.
	fleetConcurrency = 64
)

// TestFleetDeviceTasks runs fleetDevices simulated devices on Mosquitto
// and three `leasepool worker` processes, in two phases:
//
//   - a tenth of the devices away for fleetOutage, a command published
//     for each: over fleetWatch the store takes no write for them (no
//     claim, no state, no retry), and the commands start within a second
//     of their devices' return (online status published) at the median,
//     none past fleetResumeBound;
//
//   - one command for every device: every one succeeds, no device runs
//     two at once, and the test prints devices dispatched (first claim)
//     and completed per second.
//
//     LEASEPOOL_TEST_FLEET=1 go test -race -run 'TestFleetDeviceTasks$' -v -timeout 20m ./tests/
func TestFleetDeviceTasks(t *testing.T) {
	needFleet(t)
	testFleetDeviceTasks(t, false)
}

// TestFleetDeviceTasksEmbedded is TestFleetDeviceTasks on the embedded
// broker, hosted by one of the workers, each device logging in with a
// credential of its own (made by the simulators in one batch each); the
// broker is hosted once and never moves, no worker's lease running out
// while 9,000 devices connect at once and the workers store their
// statuses.
//
//	LEASEPOOL_TEST_FLEET=1 go test -race -run TestFleetDeviceTasksEmbedded -v -timeout 20m ./tests/
func TestFleetDeviceTasksEmbedded(t *testing.T) {
	needFleet(t)
	testFleetDeviceTasks(t, true)
}

func testFleetDeviceTasks(t *testing.T, embedded bool) {
	start := time.Now()
	ctx := testContext(t, 15*time.Minute)
	plainLeasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	prefix := "fleet" + randomSuffix(t)
	since := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }

	var url string
	var brokerArgs, simArgs []string
	if embedded {
		addr := freeLoopbackAddr(t)
		url, brokerArgs, simArgs = "tcp://"+addr, []string{"--embedded-broker", addr}, []string{"--store", storeURL}
	} else {
		url = fleetMosquitto(t, fleetDevices+16)
		brokerArgs = []string{"--mqtt", url}
	}
	var workerLogs []string
	for i := range 3 {
		_, log := fleetWorker(t, storeURL, fmt.Sprintf("fleet-w%d", i), prefix, fleetConcurrency, brokerArgs...)
		workerLogs = append(workerLogs, log)
	}
	if embedded {
		awaitListening(t, time.Minute, strings.TrimPrefix(url, "tcp://"))
	}
	id := func(i int) string { return "fleet-" + strconv.Itoa(i) }
	index := func(id string) int {
		n, err := strconv.Atoi(strings.TrimPrefix(id, "fleet-"))
		if err != nil {
			return -1
		}
		return n
	}
	isAway := func(id string) bool { return index(id) >= fleetDevices-fleetAway }
	common := append([]string{"--mqtt", url, "--prefix", prefix, "--id-prefix", "fleet-", "--latency", fleetLatency.String(), "--heartbeat", "30m"}, simArgs...)
	present := startSimProc(t, ctx, append(common, "--count", strconv.Itoa(fleetDevices-fleetAway))...)
	away := startSimProc(t, ctx, append(common, "--count", strconv.Itoa(fleetAway), "--first", strconv.Itoa(fleetDevices-fleetAway),
		"--outage-every", "1", "--outage-after", "0s", "--outage-for", fleetOutage.String(), "--outage-spread", fleetReturn.String())...)
	// The away devices are back at fleetOutage after they were up, give
	// or take their start-up's second.
	backAt := away.up.Add(fleetOutage)
	t.Logf("%s: %d simulated devices up", since(), fleetDevices)

	awaitStates(t, ctx, store, 5*time.Minute, "devices recorded online, the away ones offline", func(id string, online bool) bool {
		return online != isAway(id)
	}, fleetDevices)
	t.Logf("%s: the workers recorded %d devices online, %d offline", since(), fleetDevices-fleetAway, fleetAway)

	// Phase 1: a command for each device away; the store's writes
	// counted, by what they are of.
	counter := watchWrites(t, ctx, store, func(key, namespace, docID string) string {
		switch {
		case key != "":
			if d, ok := strings.CutPrefix(key, "away:"); ok && isAway(d) {
				return "task of a device away"
			}
			return "other task"
		case isAway(docID):
			return namespace + " of a device away"
		}
		return namespace
	})
	var ps []task.PublishParams
	for i := fleetDevices - fleetAway; i < fleetDevices; i++ {
		p, err := mqttdev.PublishParams("away:"+id(i), mqttdev.Command{Device: id(i), Command: "update"}, task.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	publishAll(t, ctx, store, ps)
	// The publishes' own change events are behind: let them pass first.
	time.Sleep(time.Second) // a count over a window: no fact to wait for
	counter.set(true)
	watchStart := time.Now()
	if watchStart.Add(fleetWatch).After(backAt.Add(-time.Second)) {
		t.Fatalf("%s: the devices away are back at %s, before a %s watch from now would end: the machine is too slow for fleetOutage %s",
			since(), backAt.Format(time.TimeOnly), fleetWatch, fleetOutage)
	}
	time.Sleep(fleetWatch) // the window of the count
	counts := counter.set(false)
	t.Logf("%s: store writes over %s with %d devices away, each with a command waiting: %v", since(), fleetWatch, fleetAway, counts)
	for class, n := range counts {
		if strings.Contains(class, "of a device away") && n > 0 {
			t.Errorf("%d writes of %s while they were away", n, class)
		}
	}

	// Their return: each command starts within a second of its device's
	// online status. The count goes on: the claims and finishes of those
	// commands show that it sees the writes it found none of above.
	counter.set(true)
	testutil.EventuallyEvery(t, time.Until(backAt)+3*time.Minute, 250*time.Millisecond, "the commands of the devices away to finish", func() bool {
		return countStates(t, ctx, store)[task.StateSucceeded] >= fleetAway
	})
	time.Sleep(time.Second) // the change stream's last events: no fact to wait for
	counts = counter.set(false)
	t.Logf("%s: the %d commands of the devices back succeeded; store writes meanwhile: %v", since(), fleetAway, counts)
	if n := counts["task of a device away"]; n < 2*fleetAway {
		t.Errorf("the change stream counted %d writes of the commands of the devices back, want a claim and a finish each (%d)", n, 2*fleetAway)
	}

	// Phase 2: one command for every device.
	ps = ps[:0]
	for i := range fleetDevices {
		p, err := mqttdev.PublishParams("all:"+id(i), mqttdev.Command{Device: id(i), Command: "ping"}, task.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	// The backlog is published paused, so that the rates measure the
	// workers and devices, not how fast this process publishes.
	if _, err := control.Pause(ctx, store, control.Kind(mqttdev.Kind)); err != nil {
		t.Fatal(err)
	}
	publishing := time.Now()
	publishAll(t, ctx, store, ps)
	publishTook := time.Since(publishing)
	published := time.Now()
	if _, err := control.Resume(ctx, store, control.Kind(mqttdev.Kind)); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 10*time.Minute, 2*time.Second, "every device's command to finish", func() bool {
		return finished(countStates(t, ctx, store)) >= fleetAway+fleetDevices
	})
	t.Logf("%s: %d commands finished", since(), fleetDevices)

	tasks := tasksByKey(t, ctx, store)
	var claimed, ended []time.Time
	for key, tk := range tasks {
		if !strings.HasPrefix(key, "all:") {
			continue
		}
		if tk.State != task.StateSucceeded {
			t.Errorf("%s: %s, want succeeded", key, tk.State)
			continue
		}
		atts := append(slices.Clone(tk.History), tk.Attempts...)
		if len(atts) == 0 {
			t.Errorf("%s: succeeded with no attempt", key)
			continue
		}
		claimed = append(claimed, atts[0].StartedAt)
		ended = append(ended, atts[len(atts)-1].EndedAt)
	}
	slices.SortFunc(claimed, time.Time.Compare)
	slices.SortFunc(ended, time.Time.Compare)

	reps := []*device.Report{present.stop(t), away.stop(t)}
	backOf := map[string]time.Time{}
	var overlaps int
	for _, r := range reps {
		overlaps += len(r.Overlaps)
		for _, o := range r.Outages {
			backOf[o.Device] = o.Back
		}
	}
	if overlaps > 0 {
		t.Errorf("%d overlapping commands: a device ran two at once", overlaps)
	}
	// Resume: from each device's return to its waiting command's start.
	var resume []time.Duration
	for _, run := range reps[1].Runs {
		if !strings.HasPrefix(run.TaskKey, "away:") {
			continue
		}
		back, ok := backOf[run.Device]
		if !ok || back.IsZero() {
			t.Errorf("%s ran %s, yet its report has no return", run.Device, run.TaskKey)
			continue
		}
		resume = append(resume, run.Start.Sub(back))
	}
	slices.Sort(resume)
	if len(resume) != fleetAway {
		t.Errorf("%d commands of the devices away ran, want %d", len(resume), fleetAway)
	} else if p50, worst := resume[len(resume)/2], resume[len(resume)-1]; p50 > time.Second || worst > fleetResumeBound {
		t.Errorf("the commands of the devices back started %s after their return at the median, up to %s (p99 %s): want within 1s, and none past %s",
			p50.Round(time.Millisecond), worst.Round(time.Millisecond), resume[len(resume)*99/100].Round(time.Millisecond), fleetResumeBound)
	}
	if len(resume) > 0 {
		t.Logf("resume after return: p50 %s, p99 %s, max %s", resume[len(resume)/2].Round(time.Millisecond),
			resume[len(resume)*99/100].Round(time.Millisecond), resume[len(resume)-1].Round(time.Millisecond))
	}
	if len(claimed) == fleetDevices {
		dispatch, done := claimed[len(claimed)-1].Sub(published), ended[len(ended)-1].Sub(published)
		if claimed[0].Before(published) {
			t.Errorf("a command was claimed at %s, before the kind was resumed at %s", claimed[0], published)
		}
		where := "Mosquitto"
		if embedded {
			where = "the embedded broker"
		}
		fmt.Printf("fleet on %s: %d devices, 3 workers x %d, %s latency: published (paused) in %s; from the resume: dispatched %.0f/s (all in %s), completed %.0f/s (all in %s)\n",
			where, fleetDevices, fleetConcurrency, fleetLatency, publishTook.Round(time.Millisecond),
			float64(fleetDevices)/dispatch.Seconds(), dispatch.Round(time.Millisecond), float64(fleetDevices)/done.Seconds(), done.Round(time.Millisecond))
	}
	if embedded {
		// The broker never moved: a move drops every connection. (Its
		// host's lease renewals queued behind the workers' writes of the
		// fleet's statuses and ran out, before those went into a lane of
		// their own.)
		hosted, lost := 0, 0
		for _, path := range workerLogs {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			hosted += strings.Count(string(b), "embedded MQTT broker hosted here")
			lost += strings.Count(string(b), "singleton lease not renewed in time") + strings.Count(string(b), "singleton lease lost")
		}
		if hosted != 1 || lost != 0 {
			t.Errorf("the broker was hosted %d times and %d leases were lost or ran out in the workers' logs; want it hosted once and none lost", hosted, lost)
		}
	}
}

// publishAll publishes ps in one batch (task.PublishMany), failing t on
// any item's error.
func publishAll(t *testing.T, ctx context.Context, store task.Store, ps []task.PublishParams) {
	t.Helper()
	outs, err := task.PublishMany(ctx, store, ps)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o.Err != nil {
			t.Fatalf("publish %s: %v", ps[i].Key, o.Err)
		}
	}
}

// TestFleetOnTheEmbeddedBroker runs fleetDevices simulated devices in one
// `device simulate --store` process against a `device broker` process
// checking their credentials in the store: the simulator makes the
// fleet's credentials in one batch, every device logs in with its own and
// stays connected, and a device given the wrong secret is refused.
//
//	LEASEPOOL_TEST_FLEET=1 go test -run TestFleetOnTheEmbeddedBroker -v ./tests/
func TestFleetOnTheEmbeddedBroker(t *testing.T) {
	needFleet(t)
	ctx := testContext(t, 5*time.Minute)
	store, storeURL := openTestStore(t, ctx)
	bin := plainLeasepoolBin(t)
	// The broker refuses to start on a store without credentials.
	if out, errOut, code := runCLI(t, "--store", storeURL, "device", "add", "operator-0"); code != 0 {
		t.Fatalf("device add: exit %d\n%s%s", code, out, errOut)
	}
	addr := freeLoopbackAddr(t)
	broker := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "device", "broker", "--listen", addr)
	startLogged(t, "broker", broker)
	awaitListening(t, 20*time.Second, addr)
	sim := startSimProc(t, ctx, "--store", storeURL, "--mqtt", "tcp://"+addr, "--count", strconv.Itoa(fleetDevices), "--id-prefix", "efleet-", "--heartbeat", "30m")
	sim.logMu.Lock()
	made := slices.ContainsFunc(sim.log, func(l string) bool {
		return strings.HasPrefix(l, fmt.Sprintf("credentials: %d made in the store", fleetDevices))
	})
	sim.logMu.Unlock()
	if !made {
		t.Errorf("no line \"credentials: %d made in the store\" from the simulator", fleetDevices)
	}
	creds, err := credential.List(ctx, store)
	if err != nil || len(creds) != fleetDevices+1 {
		t.Fatalf("%d credentials in the store (%v), want %d and the operator's", len(creds), err, fleetDevices)
	}
	// A device of the fleet with a secret of its own making is refused.
	bad := filepath.Join(t.TempDir(), "bad.creds")
	if err := os.WriteFile(bad, []byte("efleet-7:not-its-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, "device", "simulate", "--mqtt", "tcp://"+addr, "--count", "1", "--first", "7", "--id-prefix", "efleet-",
		"--credentials", bad, "--duration", "1s", "--start-timeout", "3s")
	if code == 0 || !strings.Contains(errOut, "devices not up within 3s (0 of 1 devices up)") {
		t.Errorf("a device with a wrong secret: exit %d\n%s%s", code, out, errOut)
	}
	rep := sim.stop(t)
	if len(rep.Devices) != fleetDevices || len(rep.Overlaps) != 0 {
		t.Errorf("report: %d devices, %d overlaps; want %d, none", len(rep.Devices), len(rep.Overlaps), fleetDevices)
	}
}
