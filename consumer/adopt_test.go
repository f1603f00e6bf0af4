package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// TestClaimWithLostReplyRuns: a claim write that applies but whose reply
// is lost (the store answers with an error) is found on a read and run
// at once, as one attempt. Without that, the worker would meet its own
// live lease, wait for it to end, take it over, and count the first
// attempt as expired: a task whose claims kept losing their replies
// would fail without ever running.
func TestClaimWithLostReplyRuns(t *testing.T) {
	var faults atomic.Int32
	db := memstore.New(memstore.Config{Fault: func(op memstore.Op, key string) memstore.Fault {
		if op == memstore.OpUpdate && key == "lost-reply" && faults.Add(1) == 1 {
			return memstore.Fault{Err: memstore.ErrInjected, Applied: true}
		}
		return memstore.Fault{}
	}})
	st := db.Open()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var runs atomic.Int32
	c, err := consumer.New(consumer.Config{Store: st, WorkerID: "w1",
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Job) error {
			runs.Add(1)
			return nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "lost-reply", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	var doc *task.Task
	for {
		doc, err = st.Get(ctx, "lost-reply")
		if err != nil {
			t.Fatal(err)
		}
		if doc.State.Finished() {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("task still %s with %d attempts", doc.State, len(doc.Attempts))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if faults.Load() < 1 {
		t.Fatal("no update met the injected fault: the test tests nothing")
	}
	if doc.State != task.StateSucceeded || len(doc.Attempts) != 1 || runs.Load() != 1 {
		t.Fatalf("task %s after %d attempts (%d handler runs); want succeeded in the claim whose reply was lost, one run",
			doc.State, len(doc.Attempts), runs.Load())
	}
}
