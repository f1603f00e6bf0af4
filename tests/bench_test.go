package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/bench"
)

// TestBenchCommand runs a small `leasepool bench` on an embedded store:
// every step runs against real worker processes of the binary, the JSON
// report has bench.Report's fields and sane figures, and --samples holds
// the latencies the percentiles came from.
func TestBenchCommand(t *testing.T) {
	dir := t.TempDir()
	samplesPath := filepath.Join(dir, "samples.json")
	cmd := exec.Command(leasepoolBin(t), "--store", "sqlite:"+filepath.Join(dir, "b.db"), "--log-level", "error",
		"bench", "--json", "--samples", samplesPath,
		"--tasks", "200", "--latency-tasks", "50", "--runs", "1", "--concurrency", "8", "--pending", "100")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s\nstderr:\n%s", err, out, tail(stderr.String(), 4000))
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	var r bench.Report
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	if r.LatencyTasks != 50 || r.ThroughputTasks != 200 || r.Concurrency != 8 || r.PendingTasks != 100 {
		t.Errorf("report does not echo the flags: %+v", r)
	}
	if r.InProcessMaxMs <= 0 || r.CrossProcessMaxMs <= 0 || r.InProcessP50Ms > r.InProcessP99Ms || r.CrossProcessP50Ms > r.CrossProcessP99Ms {
		t.Errorf("latency figures missing or out of order: %s", out)
	}
	if r.InProcessThroughputPerS <= 0 || r.CrossProcessThroughputPerS <= 0 {
		t.Errorf("no throughput: %s", out)
	}
	// The peer takes over once the killed holder's lease expires.
	if r.DefaultWorkerTimeoutMs <= 0 || r.TakeoverMs <= 0 || r.TakeoverMs > 3*r.DefaultWorkerTimeoutMs {
		t.Errorf("takeover %v ms with a %v ms lease: %s", r.TakeoverMs, r.DefaultWorkerTimeoutMs, out)
	}
	if r.WorkerIdleRSSBytes <= 0 || r.WorkerPeakRSSBytes <= 0 || r.WorkerRSSWithPendingBytes <= 0 {
		t.Errorf("worker memory not read: %s", out)
	}

	data, err := os.ReadFile(samplesPath)
	if err != nil {
		t.Fatal(err)
	}
	var s bench.Samples
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("--samples: %v\n%.300s", err, data)
	}
	for name, lat := range map[string][]float64{"in_process": s.InProcess, "cross_process": s.CrossProcess} {
		if len(lat) != 50 || !slices.IsSorted(lat) {
			t.Errorf("%s samples: %d, sorted %v; want the 50 latencies, sorted", name, len(lat), slices.IsSorted(lat))
		}
	}
	if got := bench.Summarize(s.CrossProcess); got.P50 != r.CrossProcessP50Ms || got.Max != r.CrossProcessMaxMs {
		t.Errorf("cross-process samples give %+v, report says p50 %v max %v", got, r.CrossProcessP50Ms, r.CrossProcessMaxMs)
	}
}

// TestBenchThroughputOnly: --throughput-only drains --runs times in worker
// processes and measures nothing else, listing each run (tests/bench/run's
// interleaved rounds read them).
func TestBenchThroughputOnly(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(leasepoolBin(t), "--store", "sqlite:"+filepath.Join(dir, "b.db"), "--log-level", "error",
		"bench", "--json", "--throughput-only", "--tasks", "200", "--runs", "2", "--concurrency", "8")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s\nstderr:\n%s", err, out, tail(stderr.String(), 4000))
	}
	var r bench.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	if len(r.CrossProcessThroughputRuns) != 2 || slices.Min(r.CrossProcessThroughputRuns) <= 0 {
		t.Fatalf("throughput runs %v; want 2 positive ones: %s", r.CrossProcessThroughputRuns, out)
	}
	if med := bench.Median(slices.Clone(r.CrossProcessThroughputRuns)); med != r.CrossProcessThroughputPerS {
		t.Errorf("throughput %v is not the median of its runs %v", r.CrossProcessThroughputPerS, r.CrossProcessThroughputRuns)
	}
	if r.InProcessThroughputPerS != 0 || r.CrossProcessMaxMs != 0 || r.TakeoverMs != 0 || r.WorkerIdleRSSBytes != 0 {
		t.Errorf("--throughput-only measured more than the worker process's throughput: %s", out)
	}
}
