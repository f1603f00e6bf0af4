package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// BenchmarkRolloutAtFleetScale measures a rollout of 100,000 devices on
// an embedded store on disk, with `leasepool` built without the race
// detector: a `leasepool worker` process runs its driver (it runs no
// device task: the commands dispatched at 1,000 a second wait, so
// executions pile up running, in one wave of every device) while `leasepool serve` answers the dashboard's
// rollout page, the API's progress and a page of devices deep in the
// list, and `leasepool rollout show` prints it. It prints each answer's
// time (wall time on loopback, an upper bound on the server's) and size,
// show's time, and the worker's resident set (VmRSS, VmHWM) once 20,000
// devices were dispatched, and fails past the bounds of
// docs/performance.md (300 ms and 300 KB a page, 1 s a show, 150 MiB):
//
//	go test ./tests -run '^$' -bench RolloutAtFleetScale -benchtime 1x
func BenchmarkRolloutAtFleetScale(b *testing.B) {
	const devices, dispatched = 100_000, 20_000
	dir := b.TempDir()
	bin := plainLeasepoolBin(b)
	storeURL := "sqlite:" + filepath.Join(dir, "s.db")
	ctx := context.Background()
	st, err := store.Open(ctx, storeURL, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ids := make([]string, devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("pump-%06d", i)
	}
	waves, _ := rollout.ParseWaves("100%")
	rules, _ := rollout.ParseAbortRules("failed>5% after 100")
	start := time.Now()
	if _, err := rollout.Create(ctx, st, "fleet", rollout.Spec{Command: "update", Args: []byte(`{"firmware":"2.0"}`), Devices: ids,
		Waves: waves, AbortWhen: rules, Rate: rollout.Rate{N: 1000, Per: task.Duration(time.Second)}, RollbackCommand: "rollback"}); err != nil {
		b.Fatal(err)
	}
	b.Logf("created a rollout of %d devices in %s", devices, time.Since(start).Round(time.Millisecond))

	metricsAddr := freeAddr(b)
	worker := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "worker", "--id", "w1", "--kinds", "noop", "--concurrency", "4",
		"--metrics-addr", metricsAddr)
	worker.Stderr = os.Stderr
	if err := worker.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { worker.Process.Kill(); worker.Wait() }()
	addr := freeAddr(b)
	serve := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "serve", "--listen", addr)
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	url := "http://" + addr
	testutil.EventuallyEvery(b, 30*time.Second, 20*time.Millisecond, "serve to answer", func() bool {
		code, err := httpGet(url + "/api/v1/stats")
		return err == nil && code == 200
	})
	// The driver starts the wave and dispatches.
	testutil.EventuallyEvery(b, 2*time.Minute, 200*time.Millisecond, fmt.Sprintf("%d devices dispatched", dispatched), func() bool {
		r, err := rollout.GetHead(ctx, st, "fleet")
		if err != nil {
			b.Fatal(err)
		}
		return r.Progress().Total.Running >= dispatched
	})
	rss, hwm := procMemory(b, worker.Process.Pid)
	b.Logf("worker with the rollout active (%d running): VmRSS %.1f MiB, VmHWM %.1f MiB; Go heap %s", dispatched, rss, hwm, goHeap(b, "http://"+metricsAddr+"/metrics"))
	if hwm > 150 {
		b.Errorf("the worker's peak resident set is %.1f MiB, over 150 MiB", hwm)
	}

	for _, page := range []struct{ what, path string }{
		{"dashboard page", "/rollout?name=fleet"},
		{"dashboard page, devices from 60,000", "/rollout?name=fleet&offset=60000"},
		{"dashboard page, failed devices", "/rollout?name=fleet&outcome=failed"},
		{"API progress", "/api/v1/rollouts/fleet"},
		{"API devices, 1,000 from 50,000", "/api/v1/rollouts/fleet/devices?offset=50000&limit=1000"},
	} {
		var times []time.Duration
		size := 0
		for range 10 {
			t0 := time.Now()
			resp, err := http.Get(url + page.path)
			if err != nil {
				b.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d %v %.300s", page.path, resp.StatusCode, err, body)
			}
			times = append(times, time.Since(t0))
			size = len(body)
		}
		slices.Sort(times)
		b.Logf("%s: %d bytes, median %s, slowest %s of 10", page.what, size, times[5].Round(100*time.Microsecond), times[9].Round(100*time.Microsecond))
		if times[5] > 300*time.Millisecond || size > 300_000 {
			b.Errorf("%s: %d bytes in %s, over 300 KB or 300 ms", page.what, size, times[5])
		}
	}

	for _, args := range [][]string{{"rollout", "show", "fleet"}, {"rollout", "show", "fleet", "--devices", "--offset", "50000", "--limit", "100"}} {
		t0 := time.Now()
		out, err := exec.Command(bin, append([]string{"--store", storeURL}, args...)...).CombinedOutput()
		took := time.Since(t0)
		if err != nil || !strings.Contains(string(out), "rollout fleet:") {
			b.Fatalf("%s: %v\n%.500s", strings.Join(args, " "), err, out)
		}
		b.Logf("leasepool %s: %s (the process, start to exit), %d bytes printed", strings.Join(args, " "), took.Round(time.Millisecond), len(out))
		if took > time.Second {
			b.Errorf("leasepool %s took %s, over 1 s", strings.Join(args, " "), took)
		}
	}
}

// goHeap is what a process's metrics say of its Go heap, in MiB.
func goHeap(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		for _, m := range []string{"go_memstats_heap_inuse_bytes ", "go_memstats_heap_sys_bytes ", "go_memstats_sys_bytes "} {
			if v, ok := strings.CutPrefix(line, m); ok {
				f, _ := strconv.ParseFloat(v, 64)
				out = append(out, fmt.Sprintf("%s%.1f", strings.TrimPrefix(m, "go_memstats_"), f/(1<<20)))
			}
		}
	}
	return strings.Join(out, ", ")
}

// procMemory reads a process's resident set now and at its peak, in MiB.
func procMemory(t testing.TB, pid int) (rss, hwm float64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}
