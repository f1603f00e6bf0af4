package tests

// The drain figure of worker processes on one embedded store, printed on
// demand (not a timed test): 20,000 pre-published noop tasks drained by
// one process of concurrency 32 and by four of concurrency 8, in rounds
// that alternate which goes first, so that load from other work on the
// machine falls on both alike; the medians and their ratio are printed.
//
//	go test ./tests -run '^$' -bench DrainScaling -benchtime 1x
//
// LEASEPOOL_DRAIN_ROUNDS sets the number of rounds (default 3);
// LEASEPOOL_DRAIN_PROFILE names a directory for each worker's CPU profile.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

const drainTasks = 20000

// BenchmarkDrainScaling prints tasks/s of 1 and of 4 worker processes
// draining one embedded store, interleaved, and 4's median over 1's.
func BenchmarkDrainScaling(b *testing.B) {
	bin := fastBin(b)
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("LEASEPOOL_DRAIN_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	profiles := os.Getenv("LEASEPOOL_DRAIN_PROFILE")
	rates := map[int][]float64{}
	fmt.Println("| round | worker processes | concurrency each | tasks | tasks/s (first start to last end) | claim conflicts per task | writes per commit | write lock held per task | write lock busy (held ÷ workers' run time) | per commit: begin, statements, commit |")
	fmt.Println("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for round := 1; round <= rounds; round++ {
		order := []int{1, 4}
		if round%2 == 0 {
			order = []int{4, 1}
		}
		for _, n := range order {
			b.Run(fmt.Sprintf("round%d-%dprocs", round, n), func(b *testing.B) {
				var global func(int) []string
				if profiles != "" {
					global = func(i int) []string {
						return []string{"--cpuprofile", filepath.Join(profiles, fmt.Sprintf("drain-r%d-n%d-w%d.pprof", round, n, i))}
					}
				}
				d := drainOnce(b, bin, n, global)
				rates[n] = append(rates[n], d.rate)
				fmt.Printf("| %d | %d | %d | %d | %.0f | %.3f | %.1f | %.0f µs | %.0f %% | %.0f, %.0f, %.0f µs |\n", round, n, 32/n, drainTasks, d.rate, d.conflicts,
					d.writesPerCommit, 1e6*d.lockHeld/drainTasks, 100*d.lockHeld/d.run, 1e6*d.begin/d.commits, 1e6*d.statements/d.commits, 1e6*d.commit/d.commits)
			})
		}
	}
	one, four := median(rates[1]), median(rates[4])
	fmt.Printf("\nmedian tasks/s: 1 process %.0f, 4 processes %.0f; 4 drain %.0f %% of 1\n", one, four, 100*four/one)
}

// drained is what one drain measured: tasks/s from the first attempt's
// start to the last one's end (span, in seconds), the claim conflicts per
// task, and the embedded store's write batches and the seconds its write
// lock was held, summed over the worker processes, over run, the seconds
// from their start to the end of the drain (start-up included: the busy
// share it gives is a lower bound), and what the commits' hold of the
// lock went on (seconds, summed; see sqlitestore.WriteStats).
type drained struct {
	rate, span, run, conflicts, writesPerCommit, lockHeld float64
	commits, begin, statements, commit                    float64
}

// drainOnce publishes drainTasks noop tasks to a fresh store and drains
// them with n worker processes of concurrency 32/n.
func drainOnce(b *testing.B, bin string, n int, global func(int) []string) drained {
	ctx := context.Background()
	st, url := openFigureStore(b)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := g; i < drainTasks; i += 32 {
				if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: fmt.Sprintf("d%05d", i), Kind: "noop"}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	start := time.Now()
	fw := startFigureWorkers(b, bin, url, n, 32/n, global)
	waitSucceeded(b, st, drainTasks)
	var d drained
	var writes float64
	for _, a := range fw.addrs {
		d.conflicts += metricSum(b, a, "leasepool_claim_conflicts_total")
		d.commits += metricSum(b, a, "leasepool_store_commits_total")
		writes += metricSum(b, a, "leasepool_store_committed_writes_total")
		d.lockHeld += metricSum(b, a, "leasepool_store_write_lock_held_seconds_total")
		d.begin += metricSum(b, a, `leasepool_store_write_phase_seconds_total{phase="begin"}`)
		d.statements += metricSum(b, a, `leasepool_store_write_phase_seconds_total{phase="statements"}`)
		d.commit += metricSum(b, a, `leasepool_store_write_phase_seconds_total{phase="commit"}`)
	}
	d.run = time.Since(start).Seconds()
	fw.stop()
	d.span = drainSpan(b, st).Seconds()
	d.rate, d.conflicts, d.writesPerCommit = drainTasks/d.span, d.conflicts/drainTasks, writes/d.commits
	return d
}

// drainSpan is the time from the first attempt's start to the last one's
// end, as stored in st's tasks.
func drainSpan(b *testing.B, st task.Store) time.Duration {
	var first, last time.Time
	for after := int64(0); ; {
		page, err := st.List(context.Background(), task.ListQuery{AfterSeq: after, Limit: 1000})
		if err != nil {
			b.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, tk := range page {
			for _, w := range tk.Attempts {
				if first.IsZero() || w.StartedAt.Before(first) {
					first = w.StartedAt
				}
				if w.EndedAt.After(last) {
					last = w.EndedAt
				}
			}
		}
		after = page[len(page)-1].Seq
	}
	return last.Sub(first)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
