package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// TestShareEmptyAmongMoreWorkersThanBuckets: a worker among more live
// workers than there are share buckets, itself ranking first for none,
// and none of the others claiming anything (stuck, or a registry listing
// processes long gone), runs a backlog far longer than its heap, and
// once it is done reads the store no more: its empty share never leaves
// a page to be read again and again.
func TestShareEmptyAmongMoreWorkersThanBuckets(t *testing.T) {
	const others, n = task.ShareBuckets + 200, 300
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{Latency: func(memstore.Op, string) time.Duration { return time.Millisecond }})
		reg := db.Open()
		now := time.Now()
		var ws []task.WorkerInfo
		for i := range others {
			w := task.WorkerInfo{ID: fmt.Sprintf("stuck%05d", i), Instance: "x", Concurrency: 1, Heartbeat: now, Until: now.Add(time.Hour)}
			if err := reg.RegisterWorker(t.Context(), task.RegisterParams{Worker: w, Now: now}); err != nil {
				t.Fatal(err)
			}
			ws = append(ws, w)
		}
		// The first id that ranks first for no bucket among them.
		var id string
		for i := 0; id == ""; i++ {
			self := task.WorkerInfo{ID: fmt.Sprintf("live%d", i), Instance: "y", Concurrency: 1, Until: now.Add(time.Hour)}
			if len(preempt.NewPeers(append(ws, self), self, now).Share(self.ID, nil)) == 0 {
				id = self.ID
			}
		}
		st := db.Open()
		c, err := consumer.New(consumer.Config{Store: st, WorkerID: id, Concurrency: 1, HeapSize: 50, PageSize: 10,
			Handler: consumer.HandlerFunc(func(context.Context, *consumer.Job) error { time.Sleep(time.Millisecond); return nil }), // a task's work, in virtual time
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer c.Stop(context.Background())
		awaitPeersKnown(t, st.Now(), c)
		synctest.Wait() // and has stored what it read
		publishN(t, db.Open(), "b", n)
		r := &shareRun{db: db}
		r.waitSucceeded(t, n, time.Minute)
		drained := st.Counts()
		t.Logf("%d candidate reads (%d rows) for %d tasks", drained.Reads, drained.CandidateRows, n)
		if rows := drained.CandidateRows; rows > 4*n {
			t.Errorf("%d candidate rows read for %d tasks; want at most %d", rows, n, 4*n)
		}
		// 20 s of virtual time, short of the 30 s safety net.
		testutil.Consistently(t, 20*time.Second, "no store reads with nothing left to run", func() bool { return st.Counts().Reads == drained.Reads })
	})
}
