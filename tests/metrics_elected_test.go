package tests

import (
	"fmt"

	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStoreGaugesFromOneWorker: of two `leasepool worker --metrics-addr`
// processes on one store, one at a time, the elected one, exports the
// store's gauges (the cluster's, so scrapes read the store once per
// cluster); the other leaves them out and keeps its own series. When the
// elected one stops, the other is elected within the election's renewal
// period (1 s) and exports them, its cached gauges read within 5 s.
// `--metrics-store-gauges bookkeeper`, the former name of elected, still
// works; `every` exports them from a worker that is not elected; a bad
// value exits 2 naming the flag. About 13 s.
func TestStoreGaugesFromOneWorker(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "store.db")

	out, err := exec.Command(leasepoolBin(t), "--store", url, "worker", "--metrics-addr", freeAddr(t),
		"--metrics-store-gauges", "sometimes").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--metrics-store-gauges") ||
		strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("--metrics-store-gauges sometimes: exit %d, output %q; want exit 2 and one line naming the flag", code, out)
	}

	addrs := []string{freeAddr(t), freeAddr(t)}
	procs := []*workerProc{
		startWorker(t, url, "g1", "--kinds", "noop", "--metrics-addr", addrs[0]),
		startWorker(t, url, "g2", "--kinds", "noop", "--metrics-addr", addrs[1], "--metrics-store-gauges", "bookkeeper"),
	}
	// exporter is the one worker exporting the store's gauges, with both
	// workers live, or -1; the other must export none of them, and both
	// their own series.
	exporter := func(addrs []string, live func(float64) bool) int {
		k := -1
		for i, addr := range addrs {
			text, _ := scrape("http://"+addr+"/metrics", "")
			if !strings.Contains(text, "go_goroutines") {
				return -1 // not serving yet
			}
			switch {
			case sample(text, "leasepool_store_up") == 1 && live(sample(text, "leasepool_workers_live")) &&
				sample(text, "leasepool_rollouts_up") == 1 && k == -1:
				k = i
			case sample(text, "leasepool_store_up") != -1 || sample(text, "leasepool_workers_live") != -1 ||
				sample(text, `leasepool_flows{state="running"}`) != -1 || sample(text, "leasepool_rollouts_up") != -1:
				return -1 // two exporters, or figures not settled
			}
		}
		return k
	}
	both := func(v float64) bool { return v == 2 }
	k := -1
	eventually(t, 30*time.Second, "one worker exporting the store's gauges", func() bool {
		k = exporter(addrs, both)
		return k >= 0
	})
	consistently(t, 500*time.Millisecond, fmt.Sprintf("the store's gauges from worker %d alone", k),
		func() bool { return exporter(addrs, both) == k })

	if err := procs[k].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	procs[k].cmd.Wait()
	stopped := time.Now()
	other := 1 - k
	eventually(t, 20*time.Second, "the store's gauges from the other worker", func() bool {
		return exporter(addrs[other:other+1], func(v float64) bool { return v >= 1 }) == 0
	})
	if took := time.Since(stopped); took > 10*time.Second {
		t.Errorf("the other worker exported the store's gauges %s after the elected one stopped, want within the election's renewal (1 s) and the gauges' cache (5 s)", took)
	}

	every := freeAddr(t)
	startWorker(t, url, "g3", "--kinds", "noop", "--metrics-addr", every, "--metrics-store-gauges", "every")
	eventually(t, 30*time.Second, "the store's gauges from the worker told every", func() bool {
		text, _ := scrape("http://"+every+"/metrics", "")
		return sample(text, "leasepool_store_up") == 1 && sample(text, "leasepool_workers_live") >= 2 &&
			sample(text, "leasepool_rollouts_up") == 1
	})
}
