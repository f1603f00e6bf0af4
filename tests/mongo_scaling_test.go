package tests

// Figures for worker processes on the MongoDB wire test server, printed on
// demand (not a timed test): claim conflicts per task with 1, 2, 4 and 8
// idle worker processes while tasks are published at 100/s, and a drain
// of pre-published tasks by 1 and by 4 processes, interleaved.
//
//	eval "$(tests/servers up)"    # export its LEASEPOOL_TEST_* lines
//	go test ./tests -run '^$' -bench MongoScaling -benchtime 1x
//
// Each run starts a wire test server of its own (in memory).

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// freshMongoURI starts a wire test server of b's own and returns its URI
// with a database name. Not the shared server: it recomputes each change
// stream over its whole oplog at every poll, so its cost grows with every
// write since it started, and the writes of these runs would slow every
// later test that uses it.
func freshMongoURI(b *testing.B) string {
	base, _, _ := testservers.StartMongo(b, "")
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	u.Path = fmt.Sprintf("/lp_scaling_%d_%d", time.Now().UnixNano()%1_000_000_000, mongoDBSeq.Add(1))
	return u.String()
}

func openScalingMongo(b *testing.B, uri string) task.Store {
	st, err := mongostore.Open(context.Background(), uri, nil)
	if err != nil {
		b.Fatalf("open %s: %v", uri, err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// BenchmarkMongoScaling prints claim conflicts per task and drain
// throughput of worker processes on the MongoDB wire test server.
func BenchmarkMongoScaling(b *testing.B) {
	bin := fastBin(b)
	ctx := context.Background()

	printConflictFigures(b, bin, 200, 10*time.Millisecond, // 100/s
		func(b *testing.B) (task.Store, string) {
			uri := freshMongoURI(b)
			return openScalingMongo(b, uri), uri
		})

	const drain = 400
	rates := map[int][]float64{}
	fmt.Println()
	fmt.Println("| round | worker processes | concurrency each | tasks | tasks/s (first start to last end) | claim conflicts per task |")
	fmt.Println("|--:|--:|--:|--:|--:|--:|")
	for round := 1; round <= 2; round++ {
		order := []int{1, 4}
		if round%2 == 0 {
			order = []int{4, 1}
		}
		for _, n := range order {
			b.Run(fmt.Sprintf("drain-round%d-%dprocs", round, n), func(b *testing.B) {
				uri := freshMongoURI(b)
				st := openScalingMongo(b, uri)
				var wg sync.WaitGroup
				for g := range 16 {
					wg.Go(func() {
						for i := g; i < drain; i += 16 {
							if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: fmt.Sprintf("d%05d", i), Kind: "noop"}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				fw := startFigureWorkers(b, bin, uri, n, 32/n, nil)
				waitSucceeded(b, st, drain)
				var conflicts float64
				for _, a := range fw.addrs {
					conflicts += metricSum(b, a, "leasepool_claim_conflicts_total")
				}
				fw.stop()
				rate := drain / drainSpan(b, st).Seconds()
				rates[n] = append(rates[n], rate)
				fmt.Printf("| %d | %d | %d | %d | %.0f | %.3f |\n", round, n, 32/n, drain, rate, conflicts/drain)
			})
		}
	}
	one, four := median(rates[1]), median(rates[4])
	fmt.Printf("\nmedian tasks/s: 1 process %.0f, 4 processes %.0f; 4 drain %.0f %% of 1\n", one, four, 100*four/one)
}
