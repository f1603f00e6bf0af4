package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/task"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPercentileNearestRank(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		sorted []float64
		p      int
		want   float64
	}{
		{nil, 50, 0},
		{[]float64{7}, 0, 7},
		{[]float64{7}, 99, 7},
		{ten, 0, 1},
		{ten, 10, 1},
		{ten, 11, 2},
		{ten, 50, 5},
		{ten, 90, 9},
		{ten, 99, 10},
		{ten, 100, 10},
		{[]float64{1, 2, 3}, 50, 2},
		{[]float64{1, 2, 3, 4}, 50, 2},
	} {
		if got := Percentile(c.sorted, c.p); got != c.want {
			t.Errorf("Percentile(%v, %d) = %v, want %v", c.sorted, c.p, got, c.want)
		}
	}
}

func TestMedianSorts(t *testing.T) {
	v := []float64{30, 10, 20, 50, 40}
	if got := Median(v); got != 30 {
		t.Errorf("Median = %v, want 30", got)
	}
	if v[0] != 10 || v[4] != 50 {
		t.Errorf("Median left %v unsorted", v)
	}
}

func TestLatenciesAndSummary(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	published := map[string]time.Time{"a": t0, "b": t0, "c": t0, "never": t0}
	started := map[string]time.Time{
		"a": t0.Add(3 * time.Millisecond), "b": t0.Add(1500 * time.Microsecond),
		"c":     t0.Add(-10 * time.Microsecond), // started before publish returned
		"other": t0,
	}
	lat := Latencies(published, started)
	want := []float64{-0.01, 1.5, 3}
	if len(lat) != len(want) {
		t.Fatalf("Latencies = %v, want %v", lat, want)
	}
	for i := range want {
		if lat[i] != want[i] {
			t.Fatalf("Latencies = %v, want %v", lat, want)
		}
	}
	if s := Summarize(lat); s != (Summary{P50: 1.5, P90: 3, P99: 3, Max: 3}) {
		t.Errorf("Summarize = %+v", s)
	}
	if got := Ms(1234567 * time.Nanosecond); got != 1.234 {
		t.Errorf("Ms = %v, want 1.234 (to the microsecond)", got)
	}
}

// TestReportJSONMatchesResults: the report tests/bench/results holds
// decodes with no unknown field and encodes back to the same bytes, so the
// names, their order and the number formats are what tests/bench reads.
func TestReportJSONMatchesResults(t *testing.T) {
	for _, c := range []struct {
		file string
		into any
	}{
		{"leasepool.json", &Report{}},
		{"leasepool.samples.json", &Samples{}},
	} {
		data, err := os.ReadFile(filepath.Join("..", "..", "tests", "bench", "results", c.file))
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(c.into); err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		again, err := json.Marshal(c.into)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytes.TrimSpace(data), again) {
			t.Errorf("%s encodes differently:\n%.300s\nwant\n%.300s", c.file, again, data)
		}
	}
}

func TestReportPrint(t *testing.T) {
	r := Report{
		Store: "sqlite:/tmp/b.db", LatencyTasks: 2000,
		InProcessP50Ms: 0.229, InProcessP90Ms: 0.555, InProcessP99Ms: 4.339, InProcessMaxMs: 11.992,
		CrossProcessLatency: CrossProcessLatency{CrossProcessP50Ms: 0.486, CrossProcessP90Ms: 1.089, CrossProcessP99Ms: 3.128, CrossProcessMaxMs: 8.699},
		ThroughputTasks:     20000, Concurrency: 32, InProcessThroughputPerS: 6363.4, CrossProcessThroughputPerS: 4669.6,
		TakeoverMs: 3002.997, DefaultWorkerTimeoutMs: 4000,
		WorkerPeakRSSBytes: 41000960, WorkerIdleRSSBytes: 19898368, PendingTasks: 100000, WorkerRSSWithPendingBytes: 24780800,
	}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	// tabwriter pads the first column to its widest cell and two spaces.
	want := `store                                                   sqlite:/tmp/b.db
publish-to-start, one process (2000 tasks, 2 ms apart)  p50 0.23 ms  p90 0.56 ms  p99 4.34 ms  max 11.99 ms
publish-to-start, across processes                      p50 0.49 ms  p90 1.09 ms  p99 3.13 ms  max 8.70 ms
noop throughput, concurrency 32 (20000 tasks, median)   one process 6363/s  worker process 4670/s
takeover after SIGKILL (default lease 4000 ms)          3003 ms
worker RSS                                              idle 19.0 MiB  peak in throughput run 39.1 MiB  with 100000 pending 23.6 MiB
`
	if b.String() != want {
		t.Errorf("Print:\n%s\nwant\n%s", b.String(), want)
	}
}

func TestPoll(t *testing.T) {
	calls := 0
	if err := Poll(t.Context(), time.Second, time.Millisecond, func() (bool, error) {
		calls++
		return calls == 3, nil
	}); err != nil || calls != 3 {
		t.Errorf("Poll = %v after %d calls, want nil after 3", err, calls)
	}
	if err := Poll(t.Context(), 20*time.Millisecond, time.Millisecond, func() (bool, error) { return false, nil }); !errors.Is(err, ErrTimedOut) {
		t.Errorf("Poll never done = %v, want ErrTimedOut", err)
	}
	boom := errors.New("boom")
	if err := Poll(t.Context(), time.Second, time.Millisecond, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Errorf("Poll failing = %v, want boom", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Poll(ctx, time.Minute, time.Millisecond, func() (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Poll cancelled = %v, want context.Canceled", err)
	}
}

func TestProcessStopKillRSS(t *testing.T) {
	p, err := Start(exec.Command("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	if rss := p.RSS("VmRSS"); rss <= 0 {
		t.Errorf("RSS(VmRSS) = %d, want the running process's", rss)
	}
	began := time.Now()
	p.Stop()
	if p.Cmd.ProcessState == nil || time.Since(began) > 10*time.Second {
		t.Fatalf("Stop did not reap sleep promptly (state %v)", p.Cmd.ProcessState)
	}
	if ws := p.Cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGTERM {
		t.Errorf("stopped by %v, want SIGTERM", ws.Signal())
	}
	p.Stop() // reaped already: a no-op

	k, err := Start(exec.Command("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	k.Kill()
	if ws := k.Cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("Kill: ended by %v, want SIGKILL", ws.Signal())
	}
	if rss := ProcRSS(k.Cmd.Process.Pid, "VmRSS"); rss != 0 {
		t.Errorf("ProcRSS of a reaped process = %d, want 0", rss)
	}
}

func TestRunRefusesIncompleteConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no store":         {StoreURL: "sqlite:x", WorkerCommand: func(string, string, int) *exec.Cmd { return nil }},
		"negative runs":    {Runs: -1},
		"negative tasks":   {ThroughputTasks: -5},
		"no worker":        {StoreURL: "sqlite:x"},
		"negative pending": {PendingTasks: -1},
	} {
		if _, err := Run(t.Context(), cfg); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("%s: Run = %v, want task.ErrInvalid", name, err)
		}
	}
}
