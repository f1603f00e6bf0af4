package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

func noBackoff(c *consumer.Config) { c.RetryPolicy = consumer.NoBackoff }

// A handler's result and log lines are stored with its attempt, failed or
// succeeded, bounded; the publisher reads the succeeded attempt's result.
func TestResultAndLogStoredWithAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tooBig := make(chan error, 1)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		if err := job.SetResult(map[string]int{"try": job.Attempt}); err != nil {
			return err
		}
		if job.Attempt == 1 {
			job.Logf("first try\nfails")
			return errors.New("boom")
		}
		send(tooBig, job.SetResult(strings.Repeat("x", task.MaxResultSize)))
		for i := range task.MaxLogLines + 10 {
			job.Logf("line %d", i)
		}
		return nil
	}, noBackoff)
	e.publish("out")
	doc := e.waitState("out", task.StateSucceeded)

	if err := recv(t, tooBig, "the oversized SetResult"); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "result") {
		t.Errorf("SetResult of %d bytes: %v; want ErrInvalid naming the result", task.MaxResultSize+2, err)
	}
	if len(doc.Attempts) != 2 {
		t.Fatalf("want two entries, have %+v", doc.Attempts)
	}
	failed, won := doc.Attempts[0], doc.Attempts[1]
	if failed.State != task.AttemptFail || string(failed.Result) != `{"try":1}` || len(failed.Log) != 1 || failed.Log[0].Msg != "first try fails" || failed.Log[0].At.IsZero() {
		t.Errorf("failed attempt: %+v; want result {\"try\":1} and the line \"first try fails\"", failed)
	}
	if won.State != task.AttemptSuccess || string(won.Result) != `{"try":2}` {
		t.Errorf("succeeded attempt: %+v; want result {\"try\":2} (the oversized one refused)", won)
	}
	if len(won.Log) != task.MaxLogLines || won.LogDropped != 10 || won.Log[0].Msg != "line 10" || won.Log[task.MaxLogLines-1].Msg != fmt.Sprintf("line %d", task.MaxLogLines+9) {
		t.Errorf("succeeded attempt keeps %d lines (%d dropped), first %+v; want the latest %d, 10 dropped", len(won.Log), won.LogDropped, won.Log, task.MaxLogLines)
	}
	if got := string(doc.Result()); got != `{"try":2}` {
		t.Errorf("Result() = %s; want the succeeded attempt's {\"try\":2}", got)
	}
}

// Every attempt stays in the task's history: snoozed, released on a
// graceful stop, failed and succeeded, each with its log lines.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := make(chan int, 4)
	a := e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		job.Logf("A try %d", job.Attempt)
		send(in, job.Attempt)
		if job.Attempt == 1 {
			return consumer.Snooze(10 * time.Millisecond)
		}
		return hold(ctx, t, nil)
	}, shutdownAfter(100*time.Millisecond))
	e.publish("hist", lease(100*time.Millisecond, 20*time.Second))
	recv(t, in, "attempt 1")
	if n := recv(t, in, "attempt 2"); n != 2 {
		t.Fatalf("A's second start runs attempt %d", n)
	}
	stop(t, a)
	e.worker("B", func(ctx context.Context, job *consumer.Job) error {
		job.Logf("B try %d", job.Attempt)
		if job.Attempt == 3 {
			return errors.New("boom")
		}
		return job.SetResult("done")
	}, noBackoff)
	doc := e.waitState("hist", task.StateSucceeded)

	want := []struct {
		worker string
		state  task.AttemptState
		line   string
	}{
		{"A", task.WorkerSnoozed, "A try 1"},
		{"A", task.WorkerReleased, "A try 2"},
		{"B", task.AttemptFail, "B try 3"},
		{"B", task.AttemptSuccess, "B try 4"},
	}
	all := doc.AttemptHistory()
	if len(all) != len(want) {
		t.Fatalf("history %+v; want %d attempts", all, len(want))
	}
	for i, w := range all {
		if w.Attempt != i+1 || w.WorkerID != want[i].worker || w.State != want[i].state || len(w.Log) != 1 || w.Log[0].Msg != want[i].line || w.EndedAt.IsZero() {
			t.Errorf("attempt %d: %+v; want %s %s with the line %q", i+1, w, want[i].worker, want[i].state, want[i].line)
		}
	}
	if len(doc.Attempts) != 2 || string(doc.Result()) != `"done"` {
		t.Errorf("workers %+v result %s; want the FAIL and SUCCESS entries only, result \"done\"", doc.Attempts, doc.Result())
	}
}

// A cancelled task leaves no RUNNING entry: the attempt is ended as
// CANCELLED by the cancel itself, and what its handler logged until it
// stopped is kept.
func TestCancelLeavesNoRunningEntry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := make(chan struct{}, 1)
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		job.Log("started")
		send(in, struct{}{})
		err := hold(ctx, t, nil)
		job.Log("stopping: ", err)
		return err
	})
	e.publish("cx", lease(100*time.Millisecond, 20*time.Second))
	recv(t, in, "handler start")
	if _, err := task.Cancel(context.Background(), e.store, "cx"); err != nil {
		t.Fatal(err)
	}
	doc := e.get("cx")
	if len(doc.Attempts) != 1 || doc.Attempts[0].State != task.WorkerCancelled || doc.Attempts[0].EndedAt.IsZero() {
		t.Fatalf("workers %+v; want the one attempt CANCELLED", doc.Attempts)
	}
	testutil.Eventually(t, waitLong, "the cancelled handler's log lines", func() bool {
		doc = e.get("cx")
		return len(doc.Attempts[0].Log) == 2
	})
	if w := doc.Attempts[0]; w.State != task.WorkerCancelled || w.Log[0].Msg != "started" || !strings.Contains(w.Log[1].Msg, "cancelled") || doc.State != task.StateCancelled {
		t.Errorf("task %s, entry %+v; want CANCELLED with both lines", doc.State, w)
	}
}

// A running attempt's log lines are stored with its lease renewals, so
// they show before it ends.
func TestLogShowsWhileRunning(t *testing.T) {
	t.Parallel()
	e := setup(t)
	release := make(chan struct{})
	e.worker("A", func(ctx context.Context, job *consumer.Job) error {
		job.Log("halfway")
		return hold(ctx, t, release)
	})
	e.publish("live", lease(50*time.Millisecond, 20*time.Second))
	testutil.Eventually(t, waitLong, "the running attempt's log line in the store", func() bool {
		doc := e.get("live")
		return len(doc.Attempts) == 1 && len(doc.Attempts[0].Log) == 1
	})
	if doc := e.get("live"); doc.Attempts[0].State != task.AttemptRunning || doc.Attempts[0].Log[0].Msg != "halfway" {
		t.Errorf("entry %+v; want RUNNING with the line", doc.Attempts[0])
	}
	close(release)
	if doc := e.waitState("live", task.StateSucceeded); len(doc.Attempts[0].Log) != 1 {
		t.Errorf("after success: %+v; want the one line, once", doc.Attempts[0])
	}
}
