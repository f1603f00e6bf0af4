package preempt_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// TestShareHoldsEveryTaskItsWorkerRanksFirst: among workers of mixed
// kinds (some every kind, some a few) and weights far apart (so that some
// rank first for no bucket at all), the worker ranking first for a task
// among those able to run it always reads it in its share pass: its share
// lists the task's bucket, or it reads everything (nil). A task outside
// every share as its first worker computes it would wait for a worker
// with nothing of its own due.
func TestShareHoldsEveryTaskItsWorkerRanksFirst(t *testing.T) {
	now := time.Now()
	kinds := []string{"a", "b", "c"}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 6 {
		n := 2 + rng.IntN(8)
		ws := make([]task.WorkerInfo, n)
		for i := range ws {
			var ks []string
			for _, k := range kinds {
				if rng.IntN(2) == 0 {
					ks = append(ks, k)
				}
			}
			ws[i] = task.WorkerInfo{ID: fmt.Sprintf("r%d-w%d", round, i), Kinds: ks, Concurrency: 1 + rng.IntN(64), Until: now.Add(time.Minute)}
		}
		shares := make([][]int, n)
		peers := make([]*preempt.Peers, n)
		for i, w := range ws {
			peers[i] = preempt.NewPeers(ws, w, now)
			shares[i] = peers[i].Share(w.ID, w.Kinds)
		}
		for _, k := range kinds {
			for b := range int64(task.ShareBuckets) {
				x := &task.Task{Key: fmt.Sprint(b), Kind: k, Seq: b}
				firsts := 0
				for i, w := range ws {
					if len(w.Kinds) > 0 && !slices.Contains(w.Kinds, k) {
						continue
					}
					if peers[i].Rank(x, w.ID, 1) != 0 {
						continue
					}
					firsts++
					if shares[i] != nil && !slices.Contains(shares[i], int(b)) {
						t.Fatalf("round %d: %s (kinds %v, weight %d) ranks first for a %s task of bucket %d, which its share leaves out", round, w.ID, w.Kinds, w.Concurrency, k, b)
					}
				}
				able := slices.ContainsFunc(ws, func(w task.WorkerInfo) bool { return len(w.Kinds) == 0 || slices.Contains(w.Kinds, k) })
				if able && firsts != 1 {
					t.Fatalf("round %d: %d workers rank first for a %s task of bucket %d; want 1", round, firsts, k, b)
				}
			}
		}
	}
}
