package tests

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkFairness prints what groups change, on real `leasepool
// worker` processes (built without the race detector) sharing one
// store file, with tasks of the sleep kind that sleep 1 ms:
//
//   - head-of-line: tenant A publishes 100,000 tasks, a worker starts,
//     and once it ran 1,000 of them tenant B publishes 100, with and
//     without groups: B's publish-to-start p50 and p99 while A's backlog
//     drains, and the throughput of the whole run, without groups and
//     with;
//   - weights: A (weight 3) and B (weight 1) both backlogged on four
//     worker processes: A's share of every window of 1,000 consecutive
//     claims, by start time, while both had a window's worth left (the
//     lowest and highest).
//
// Run: go test ./tests -run '^$' -bench Fairness -benchtime 1x
// (FAIRNESS_BACKLOG sets A's backlog, 100000 by default;
// FAIRNESS_ONLY=hol or weights runs one part; FAIRNESS_WEIGHT_PROCS
// spreads the 64 slots of the weights run over other than 4 processes;
// FAIRNESS_DEBUG prints A's share along the weights run).
func BenchmarkFairness(b *testing.B) {
	backlog := 100_000
	if v := os.Getenv("FAIRNESS_BACKLOG"); v != "" {
		fmt.Sscan(v, &backlog)
	}
	bin := plainLeasepoolBin(b)
	for range b.N {
		if os.Getenv("FAIRNESS_ONLY") != "weights" {
			off := headOfLine(b, bin, backlog, false)
			on := headOfLine(b, bin, backlog, true)
			fmt.Printf("head-of-line, %d tasks of A then 100 of B, 1 worker process of 32 slots:\n", backlog)
			fmt.Printf("  without groups: B start p50 %s p99 %s, %.0f tasks/s\n", off.p50, off.p99, off.rate)
			fmt.Printf("  with groups:    B start p50 %s p99 %s, %.0f tasks/s (%.0f%% of without)\n", on.p50, on.p99, on.rate, 100*on.rate/off.rate)
		}
		if os.Getenv("FAIRNESS_ONLY") == "hol" {
			continue
		}
		lo, hi, n := weights(b, bin)
		fmt.Printf("weights 3:1, 64 slots over $FAIRNESS_WEIGHT_PROCS (4) worker processes: A's share of every window of 1,000 consecutive claims (%d windows): %.1f%% to %.1f%%\n", n, 100*lo, 100*hi)
	}
}

// benchWorkers starts n worker processes on url and stops them at cleanup.
func benchWorkers(b *testing.B, bin, url string, n, slots int) {
	for i := range n {
		cmd := exec.Command(bin, "--store", url, "--log-level", "error", "worker", "--id", fmt.Sprintf("w%d", i+1), "--concurrency", fmt.Sprint(slots), "--kinds", "sleep")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

func sleepTasks(prefix, group string, n int) []task.PublishParams {
	ps := make([]task.PublishParams, n)
	for i := range ps {
		ps[i] = task.PublishParams{Key: fmt.Sprintf("%s-%06d", prefix, i), Kind: "sleep", Payload: []byte(`{"duration":"1ms"}`), Options: task.Options{Group: group}}
	}
	return ps
}

func publishBatches(b *testing.B, ctx context.Context, st task.Store, ps []task.PublishParams) {
	for len(ps) > 0 {
		n := min(len(ps), 1000)
		if _, err := task.PublishMany(ctx, st, ps[:n]); err != nil {
			b.Fatal(err)
		}
		ps = ps[n:]
	}
}

// waitAll waits until n tasks succeeded and, with list, returns them all.
func waitAll(b *testing.B, ctx context.Context, st task.Store, n int, list bool) []*task.Task {
	for {
		c, err := st.Stats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if c.ByState()[task.StateSucceeded] >= int64(n) {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("%d of %d tasks succeeded before the deadline", c.ByState()[task.StateSucceeded], n)
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !list {
		return nil
	}
	var all []*task.Task
	q := task.ListQuery{Limit: 5000}
	for {
		page, err := st.List(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < q.Limit {
			return all
		}
		q.AfterSeq = page[len(page)-1].Seq
	}
}

type holResult struct {
	p50, p99 time.Duration
	rate     float64
}

func headOfLine(b *testing.B, bin string, backlog int, groups bool) holResult {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	path := filepath.Join(b.TempDir(), "hol.db")
	st, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ga, gb := "", ""
	if groups {
		ga, gb = "A", "B"
	}
	// A's backlog is in the store, and draining, when B publishes.
	publishBatches(b, ctx, st, sleepTasks("a", ga, backlog))
	benchWorkers(b, bin, "sqlite:"+path, 1, 32)
	waitAll(b, ctx, st, min(1000, backlog/10), false)
	publishBatches(b, ctx, st, sleepTasks("b", gb, 100))
	all := waitAll(b, ctx, st, backlog+100, true)
	var waits []time.Duration
	var first, last time.Time
	for _, t := range all {
		a := t.Attempts[len(t.Attempts)-1]
		if t.Key[0] == 'b' {
			waits = append(waits, a.StartedAt.Sub(t.CreatedAt))
		}
		if first.IsZero() || a.StartedAt.Before(first) {
			first = a.StartedAt
		}
		if a.EndedAt.After(last) {
			last = a.EndedAt
		}
	}
	slices.Sort(waits)
	return holResult{
		p50:  waits[len(waits)/2].Round(time.Millisecond),
		p99:  waits[len(waits)*99/100].Round(time.Millisecond),
		rate: float64(len(all)) / last.Sub(first).Seconds(),
	}
}

// weights runs A (weight 3) and B (weight 1), both backlogged, on four
// worker processes and returns A's lowest and highest share of the
// windows of 1,000 consecutive claims while both had tasks left.
func weights(b *testing.B, bin string) (lo, hi float64, windows int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	path := filepath.Join(b.TempDir(), "weights.db")
	st, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := control.SetLimit(ctx, st, control.Limit{Target: control.Group("A"), Weight: 3}); err != nil {
		b.Fatal(err)
	}
	const each = 12_000
	as, bs := sleepTasks("a", "A", each), sleepTasks("b", "B", each)
	// Both tenants publish at once, in batches, before the workers start.
	for i := 0; i < each; i += 1000 {
		publishBatches(b, ctx, st, as[i:i+1000])
		publishBatches(b, ctx, st, bs[i:i+1000])
	}
	procs, slots := 4, 16
	if v := os.Getenv("FAIRNESS_WEIGHT_PROCS"); v != "" {
		fmt.Sscan(v, &procs)
		slots = 64 / procs
	}
	benchWorkers(b, bin, "sqlite:"+path, procs, slots)
	all := waitAll(b, ctx, st, 2*each, true)
	type claim struct {
		at     time.Time
		a      bool
		worker string
	}
	var claims []claim
	for _, t := range all {
		at := t.Attempts[len(t.Attempts)-1]
		claims = append(claims, claim{at.StartedAt, t.Group == "A", at.WorkerID})
	}
	slices.SortFunc(claims, func(x, y claim) int { return x.at.Compare(y.at) })
	// While both are backlogged: until fewer than a window's 1,000 of A's
	// tasks are left to claim (past it B runs alone).
	end, left := 0, each
	for i, c := range claims {
		if c.a {
			if left--; left < 1000 {
				end = i + 1
				break
			}
		}
	}
	if os.Getenv("FAIRNESS_DEBUG") != "" {
		for i := 0; i+1000 <= len(claims); i += 1000 {
			n := 0
			for _, c := range claims[i : i+1000] {
				if c.a {
					n++
				}
			}
			// Each worker's claims and A's part of them: a worker whose
			// own order skews shows apart from one that claims less.
			byWorker := map[string][2]int{}
			for _, c := range claims[i : i+1000] {
				w := byWorker[c.worker]
				w[0]++
				if c.a {
					w[1]++
				}
				byWorker[c.worker] = w
			}
			ws := slices.Sorted(maps.Keys(byWorker))
			var per []string
			for _, w := range ws {
				per = append(per, fmt.Sprintf("%s %d/%d", w, byWorker[w][1], byWorker[w][0]))
			}
			past := ""
			if i+1000 > end {
				past = " past the end"
			}
			fmt.Printf("  claims %5d..: A %d/1000 at %s (%s)%s\n", i, n, claims[i].at.Sub(claims[0].at).Round(time.Millisecond), strings.Join(per, ", "), past)
		}
	}
	// Every window: claims i to i+999, for each i.
	lo, hi = 1, 0
	n, loAt, hiAt := 0, 0, 0
	for i, c := range claims[:end] {
		if c.a {
			n++
		}
		if i >= 1000 && claims[i-1000].a {
			n--
		}
		if i >= 999 {
			share := float64(n) / 1000
			if share < lo {
				lo, loAt = share, i-999
			}
			if share > hi {
				hi, hiAt = share, i-999
			}
			windows++
		}
	}
	if os.Getenv("FAIRNESS_DEBUG") != "" {
		fmt.Printf("  lowest from claim %d, highest from claim %d, of %d while both had a window's worth left\n", loAt, hiAt, end)
	}
	return lo, hi, windows
}
