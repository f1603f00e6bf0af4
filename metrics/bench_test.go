//go:build unix

package metrics_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkMetricsOverhead measures a worker's noop throughput with the
// Prometheus observer and without, interleaved (off, on, then on, off, ...)
// so that a shared, loaded machine's drift hits both alike, each drain on
// a fresh store file. It prints every figure, the medians and the cost.
//
//	go test -run '^$' -bench MetricsOverhead -benchtime 1x ./metrics
//
// LEASEPOOL_BENCH_ROUNDS and LEASEPOOL_BENCH_TASKS change the rounds (6)
// and the tasks per drain (3000).
func BenchmarkMetricsOverhead(b *testing.B) {
	rounds, tasks := envInt(b, "LEASEPOOL_BENCH_ROUNDS", 6), envInt(b, "LEASEPOOL_BENCH_TASKS", 3000)
	for range b.N {
		var off, on, cpuOff, cpuOn []float64
		for r := range rounds {
			order := []bool{false, true}
			if r%2 == 1 {
				order = []bool{true, false}
			}
			for _, withMetrics := range order {
				perS, cpu := drain(b, tasks, withMetrics)
				if withMetrics {
					on, cpuOn = append(on, perS), append(cpuOn, cpu)
				} else {
					off, cpuOff = append(off, perS), append(cpuOff, cpu)
				}
			}
			b.Logf("round %d: off %.0f tasks/s %.0f µs CPU/task, on %.0f tasks/s %.0f µs CPU/task", r+1, off[r], cpuOff[r], on[r], cpuOn[r])
		}
		mOff, mOn := median(off), median(on)
		cOff, cOn := median(cpuOff), median(cpuOn)
		b.Logf("metrics off: median %.0f tasks/s (min %.0f, max %.0f), %.0f µs CPU/task (min %.0f, max %.0f)",
			mOff, slices.Min(off), slices.Max(off), cOff, slices.Min(cpuOff), slices.Max(cpuOff))
		b.Logf("metrics on:  median %.0f tasks/s (min %.0f, max %.0f), %.0f µs CPU/task (min %.0f, max %.0f)",
			mOn, slices.Min(on), slices.Max(on), cOn, slices.Min(cpuOn), slices.Max(cpuOn))
		b.Logf("cost of metrics: %.1f%% of the median throughput, %.1f%% of the median CPU per task", 100*(mOff-mOn)/mOff, 100*(cOn-cOff)/cOff)
		b.ReportMetric(mOff, "off-tasks/s")
		b.ReportMetric(mOn, "on-tasks/s")
		b.ReportMetric(cOff, "off-cpu-µs/task")
		b.ReportMetric(cOn, "on-cpu-µs/task")
	}
}

// drain publishes n noop tasks on a fresh store, then times one worker
// (concurrency 32) running them all. It returns the tasks per second and
// the process's CPU time (user and system) per task during the drain: on
// a shared machine, other processes' load stretches the wall time far more
// than this process's own CPU time.
func drain(b *testing.B, n int, withMetrics bool) (perS, cpuMicros float64) {
	b.Helper()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "bench.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "t" + strconv.Itoa(i), Kind: "noop"}); err != nil {
			b.Fatal(err)
		}
	}
	var obs consumer.Observer
	if withMetrics {
		m, err := metrics.New(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		obs = m
	}
	var done atomic.Int64
	drained := make(chan struct{})
	mux := consumer.NewMux()
	mux.RegisterFunc("noop", func(context.Context, *consumer.Job) error {
		if done.Add(1) == int64(n) {
			close(drained)
		}
		return nil
	})
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, Concurrency: 32, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := cpuTime(b)
	start := time.Now()
	if err := w.Start(ctx); err != nil {
		b.Fatal(err)
	}
	select {
	case <-drained:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d tasks not drained in 5 minutes", n)
	}
	elapsed, cpu := time.Since(start), cpuTime(b)-cpu0
	if err := w.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds(), float64(cpu.Microseconds()) / float64(n)
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s: want a positive integer, got %q", name, s)
	}
	return n
}

// BenchmarkObserverPerTask is the metrics' own cost per task: one claim
// and one finish recorded, as the consumer calls them.
func BenchmarkObserverPerTask(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Claimed(consumer.ClaimEvent{Kind: "noop", Attempt: 1, Wait: 3 * time.Millisecond})
			m.Finished(consumer.FinishEvent{Kind: "noop", Attempt: 1, Outcome: consumer.OutcomeSucceeded, Started: true, Duration: time.Millisecond})
		}
	})
}
