package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestJobSucceededInHandlersCommit: a handler that finished its attempt
// in its own transaction (Tx.Succeed) and then outlived a renewal, which
// found the task finished and cancelled it, is settled as a success with
// no write of the worker's own, and its lock key is freed at once rather
// than at its lease's end.
func TestJobSucceededInHandlersCommit(t *testing.T) {
	e := setup(t)
	committed := make(chan int64, 1)
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Key != "first" {
			return nil
		}
		err := e.store.InTx(context.Background(), func(tx *sqlitestore.Tx) error {
			doc, err := tx.Succeed(job)
			if err == nil {
				committed <- doc.Version
			}
			return err
		})
		if err != nil {
			return err
		}
		<-ctx.Done() // the next renewal finds the task succeeded
		if cause := context.Cause(ctx); !errors.Is(cause, task.ErrTaskDone) {
			t.Errorf("handler cancelled by %v; want ErrTaskDone", cause)
		}
		return nil
	})
	// A lease far longer than the test: a lock key not freed by the
	// settled attempt would hold the second task back for it.
	e.publish("first", lockKeys("dev-1"), lease(50*time.Millisecond, time.Minute))
	version := recv(t, committed, "the handler's commit")
	e.publish("second", lockKeys("dev-1"))
	e.waitState("second", task.StateSucceeded)
	first := e.get("first")
	if first.State != task.StateSucceeded || first.Version != version {
		t.Errorf("first %s at version %d; want succeeded at %d, the handler's commit (no write after it)", first.State, first.Version, version)
	}
}

// TestJobSucceededIgnoresOtherDocuments: a document that does not show
// the attempt succeeded does not settle it: the worker writes the outcome.
func TestJobSucceededIgnoresOtherDocuments(t *testing.T) {
	e := setup(t)
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		job.Succeeded(job.Task)                        // this attempt still running
		job.Succeeded(&task.Task{Key: "someone-else"}) // another task
		job.Succeeded(nil)
		return nil
	})
	e.publish("k")
	doc := e.waitState("k", task.StateSucceeded)
	testutil.Eventually(t, waitLong, "the attempt's success recorded", func() bool {
		doc = e.get("k")
		return len(doc.Attempts) == 1 && doc.Attempts[0].State == task.AttemptSuccess
	})
}
