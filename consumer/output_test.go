package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/consumer"
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
	if len(doc.Workers) != 2 {
		t.Fatalf("want two entries, have %+v", doc.Workers)
	}
	failed, won := doc.Workers[0], doc.Workers[1]
	if failed.State != task.WorkerFail || string(failed.Result) != `{"try":1}` || len(failed.Log) != 1 || failed.Log[0].Msg != "first try fails" || failed.Log[0].At.IsZero() {
		t.Errorf("failed attempt: %+v; want result {\"try\":1} and the line \"first try fails\"", failed)
	}
	if won.State != task.WorkerSuccess || string(won.Result) != `{"try":2}` {
		t.Errorf("succeeded attempt: %+v; want result {\"try\":2} (the oversized one refused)", won)
	}
	if len(won.Log) != task.MaxLogLines || won.LogDropped != 10 || won.Log[0].Msg != "line 10" || won.Log[task.MaxLogLines-1].Msg != fmt.Sprintf("line %d", task.MaxLogLines+9) {
		t.Errorf("succeeded attempt keeps %d lines (%d dropped), first %+v; want the latest %d, 10 dropped", len(won.Log), won.LogDropped, won.Log, task.MaxLogLines)
	}
	if got := string(doc.Result()); got != `{"try":2}` {
		t.Errorf("Result() = %s; want the succeeded attempt's {\"try\":2}", got)
	}
}
