package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Report is what `leasepool bench --json` prints. Every name carries its
// unit; tests/bench (the peers' harness and its results) reads these names.
type Report struct {
	Store          string  `json:"store"`
	LatencyTasks   int     `json:"latency_tasks"`
	InProcessP50Ms float64 `json:"publish_to_start_in_process_p50_ms"`
	InProcessP90Ms float64 `json:"publish_to_start_in_process_p90_ms"`
	InProcessP99Ms float64 `json:"publish_to_start_in_process_p99_ms"`
	InProcessMaxMs float64 `json:"publish_to_start_in_process_max_ms"`
	CrossProcessLatency
	ThroughputTasks            int     `json:"throughput_tasks"`
	Concurrency                int     `json:"concurrency"`
	InProcessThroughputPerS    float64 `json:"throughput_in_process_per_s"`
	CrossProcessThroughputPerS float64 `json:"throughput_worker_process_per_s"`
	// CrossProcessThroughputRuns are the runs CrossProcessThroughputPerS
	// is the median of, in order.
	CrossProcessThroughputRuns []float64 `json:"throughput_runs_per_s,omitempty"`
	TakeoverMs                 float64   `json:"takeover_after_sigkill_ms"`
	DefaultWorkerTimeoutMs     float64   `json:"default_worker_timeout_ms"`
	WorkerPeakRSSBytes         int64     `json:"worker_peak_rss_throughput_bytes"`
	WorkerIdleRSSBytes         int64     `json:"worker_rss_idle_bytes"`
	PendingTasks               int       `json:"pending_tasks"`
	WorkerRSSWithPendingBytes  int64     `json:"worker_rss_with_pending_bytes"`
}

// CrossProcessLatency is publish-to-start latency from a producer process
// to a worker process, in ms: the figure leasepool and its peers are
// compared on. Embedded in a report, its fields stand in its place.
type CrossProcessLatency struct {
	CrossProcessP50Ms float64 `json:"publish_to_start_cross_process_p50_ms"`
	CrossProcessP90Ms float64 `json:"publish_to_start_cross_process_p90_ms"`
	CrossProcessP99Ms float64 `json:"publish_to_start_cross_process_p99_ms"`
	CrossProcessMaxMs float64 `json:"publish_to_start_cross_process_max_ms"`
}

// CrossProcess summarises sorted cross-process latencies.
func CrossProcess(sorted []float64) CrossProcessLatency {
	s := Summarize(sorted)
	return CrossProcessLatency{CrossProcessP50Ms: s.P50, CrossProcessP90Ms: s.P90, CrossProcessP99Ms: s.P99, CrossProcessMaxMs: s.Max}
}

// Samples are the raw publish-to-start latencies in ms, sorted, as
// `leasepool bench --samples` writes them (tests/bench plots them).
type Samples struct {
	CrossProcess []float64 `json:"cross_process"`
	InProcess    []float64 `json:"in_process"`
}

// Print writes r as the table `leasepool bench` prints.
func (r *Report) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "store\t%s\n", r.Store)
	fmt.Fprintf(tw, "publish-to-start, one process (%d tasks, 2 ms apart)\tp50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n", r.LatencyTasks, r.InProcessP50Ms, r.InProcessP90Ms, r.InProcessP99Ms, r.InProcessMaxMs)
	fmt.Fprintf(tw, "publish-to-start, across processes\tp50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n", r.CrossProcessP50Ms, r.CrossProcessP90Ms, r.CrossProcessP99Ms, r.CrossProcessMaxMs)
	fmt.Fprintf(tw, "noop throughput, concurrency %d (%d tasks, median)\tone process %.0f/s  worker process %.0f/s\n", r.Concurrency, r.ThroughputTasks, r.InProcessThroughputPerS, r.CrossProcessThroughputPerS)
	fmt.Fprintf(tw, "takeover after SIGKILL (default lease %.0f ms)\t%.0f ms\n", r.DefaultWorkerTimeoutMs, r.TakeoverMs)
	fmt.Fprintf(tw, "worker RSS\tidle %.1f MiB  peak in throughput run %.1f MiB  with %d pending %.1f MiB\n",
		mib(r.WorkerIdleRSSBytes), mib(r.WorkerPeakRSSBytes), r.PendingTasks, mib(r.WorkerRSSWithPendingBytes))
	return tw.Flush()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
