package sim_test

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/tests/sim"
)

var (
	big       = flag.Bool("sim.big", false, "run the scaling table: W = 1, 10, 100, 1,000 workers")
	schedules = flag.Int("sim.schedules", 0, "run this many random fault schedules (small clusters, kills, faults)")
	out       = flag.String("sim.out", "", "append the printed table to this file")
	takeovers = flag.Int("sim.takeovers", 20, "run this many takeover schedules (half the workers killed holding 1-3 s tasks, free slots left)")
)

// run runs cfg in its own bubble and fails t on any invariant violation.
func run(t *testing.T, cfg sim.Config) sim.Result {
	t.Helper()
	var res sim.Result
	synctest.Test(t, func(t *testing.T) { res = sim.Run(t.Context(), cfg) })
	for _, v := range res.Violations {
		t.Errorf("W=%d seed %d: %s", cfg.Workers, cfg.Seed, v)
	}
	return res
}

// TestSimSmall is the configuration CI runs: a few workers, kills, pins,
// lock lines and injected faults, checked for every invariant.
func TestSimSmall(t *testing.T) {
	for _, cfg := range []sim.Config{
		{Workers: 4, Tasks: 200, PublishEvery: 2 * time.Millisecond, PinEvery: 7, LockEvery: 5, Seed: 1},
		{Workers: 6, Tasks: 200, PublishEvery: 5 * time.Millisecond, Work: 300 * time.Millisecond, Kill: 2, PinEvery: 9, LockEvery: 6, FaultRate: 0.02, Seed: 2},
		{Workers: 3, Tasks: 300, Seed: 3},
	} {
		t.Run(fmt.Sprintf("W%d-seed%d", cfg.Workers, cfg.Seed), func(t *testing.T) {
			r := run(t, cfg)
			t.Logf("\n%s\n%s", sim.Header, r.Row())
			if cfg.Kill > 0 && r.Takeovers == 0 {
				t.Errorf("%d workers killed while running 300 ms tasks, and no claim took over a lease", cfg.Kill)
			}
		})
	}
}

// TestSimScale checks that costs per task stay flat as workers are added
// (W = 1, 10, 100 in CI), prints the big scaling table with -sim.big
// (W up to 1,000) and runs random fault schedules with -sim.schedules N.
func TestSimScale(t *testing.T) {
	var flat []sim.Result
	for _, w := range []int{1, 10, 100} {
		flat = append(flat, run(t, sim.Config{Workers: w, Tasks: 200, PublishEvery: 2 * time.Millisecond, Seed: 5}))
	}
	t.Logf("\n%s", sim.Table(flat))
	for _, r := range flat[1:] {
		if r.Writes > flat[0].Writes*1.1 || r.Conflicts > 0.1 {
			t.Errorf("W=%d: %.2f writes and %.2f conflicts per task; want within 10%% of W=1's %.2f writes and at most 0.1 conflicts",
				r.Config.Workers, r.Writes, r.Conflicts, flat[0].Writes)
		}
	}
	var table []sim.Result
	if *big {
		for _, w := range []int{1, 10, 100, 1000} {
			cfg := sim.Config{Workers: w, Tasks: 2000, PublishEvery: 2 * time.Millisecond, Seed: 1}
			start := time.Now()
			table = append(table, run(t, cfg))
			t.Logf("W=%d in %s", w, time.Since(start).Round(time.Millisecond))
		}
		// Takeover: long tasks, a tenth of the workers killed.
		for _, w := range []int{10, 100} {
			table = append(table, run(t, sim.Config{Workers: w, Tasks: 500, PublishEvery: 2 * time.Millisecond,
				Work: 2 * time.Second, Kill: w / 10, Seed: 2}))
		}
		text := sim.Table(table)
		fmt.Println(text)
		if *out != "" {
			f, err := os.OpenFile(*out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(f, text)
			f.Close()
		}
	}
	var bad, takeovers int
	var takeoverMax time.Duration
	for i := range *schedules {
		r := run(t, sim.Config{Workers: 2 + i%7, Tasks: 40, PublishEvery: 3 * time.Millisecond,
			Work: time.Duration(1+i%400) * time.Millisecond, Kill: 1 + i%3, PinEvery: 5, LockEvery: 3,
			FaultRate: 0.05, Seed: uint64(1000 + i)})
		if len(r.Violations) > 0 {
			bad++
		}
		takeovers += r.Takeovers
		takeoverMax = max(takeoverMax, r.TakeoverMax)
	}
	if *schedules > 0 {
		fmt.Printf("%d fault schedules, %d with violations; %d takeovers, the longest %s after the lease ended\n",
			*schedules, bad, takeovers, takeoverMax.Round(time.Millisecond))
	}
}

// TestSimRenewalsDoNotFanOut: a 60 s task renewing every second reaches
// each other worker as at most 4 change events over its life (its
// publish, claim and finish), not one per renewal.
func TestSimRenewalsDoNotFanOut(t *testing.T) {
	r := run(t, sim.Config{Workers: 10, Tasks: 1, Work: 60 * time.Second, Seed: 4})
	t.Logf("\n%s\n%s", sim.Header, r.Row())
	if r.Writes < 60 {
		t.Fatalf("%.0f writes for a 60 s task with 1 s pings; want its renewals (over 60)", r.Writes)
	}
	if r.Events > 4 {
		t.Fatalf("%.1f change events per worker for one 60 s task; want at most 4", r.Events)
	}
}

// TestSimTakeover runs -sim.takeovers drains (20 by default, in CI) in which half the
// workers are cut off the store while they hold 1 to 3 s tasks and the
// others have free slots for every task: each lease a dead worker held is
// taken over within 250 ms of its end (a lease plus 250 ms of the
// holder's last renewal).
//
//	go test ./tests/sim -run TestSimTakeover -v -args -sim.takeovers 1000
func TestSimTakeover(t *testing.T) {
	const bound = 250 * time.Millisecond
	var count, late int
	var longest time.Duration
	for i := range *takeovers {
		w := 2 + i%7
		r := run(t, sim.Config{Workers: w, Tasks: 4 * (w - w/2), Work: time.Duration(1000+i%2000) * time.Millisecond,
			Kill: w / 2, Seed: uint64(5000 + i)})
		count += r.Takeovers
		longest = max(longest, r.TakeoverMax)
		if r.TakeoverMax > bound {
			late++
			t.Errorf("W=%d seed %d: a lease taken over %s after it ended; want within %s", w, 5000+i, r.TakeoverMax, bound)
		}
	}
	fmt.Printf("%d takeover schedules: %d takeovers, the longest %s after the lease ended, %d over %s\n",
		*takeovers, count, longest.Round(time.Millisecond), late, bound)
	if count == 0 {
		t.Fatal("no lease was taken over: the schedules test nothing")
	}
}
