package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// A handler leaves a result and log lines with its attempt; the publisher
// reads the result once the task succeeded, and every attempt's record.
func ExampleJob_SetResult() {
	dir, _ := os.MkdirTemp("", "leasepool")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "tasks.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	done := make(chan struct{}, 2)
	mux := consumer.NewMux()
	mux.RegisterFunc("sum", func(ctx context.Context, job *consumer.Job) error {
		defer func() { done <- struct{}{} }()
		if job.Attempt == 1 {
			job.Log("first try: snoozing")
			return consumer.Snooze(0)
		}
		var in []int
		if err := json.Unmarshal(job.Task.Payload, &in); err != nil {
			return err
		}
		sum := 0
		for _, n := range in {
			sum += n
		}
		job.Logf("summed %d numbers", len(in))
		return job.SetResult(map[string]int{"sum": sum})
	})
	w, err := consumer.New(consumer.Config{Store: store, Handler: mux, WorkerID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if _, _, err := task.Publish(ctx, store, task.PublishParams{Key: "sum-1", Kind: "sum", Payload: json.RawMessage(`[1,2,3]`)}); err != nil {
		log.Fatal(err)
	}
	<-done
	<-done
	if err := w.Stop(ctx); err != nil { // the outcome is written before Stop returns
		log.Fatal(err)
	}

	t, err := store.Get(ctx, "sum-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.State, string(t.Result()))
	for _, a := range t.AttemptHistory() {
		fmt.Println(a.Attempt, a.State, a.Log[0].Msg)
	}
	// Output:
	// succeeded {"sum":6}
	// 1 SNOOZED first try: snoozing
	// 2 SUCCESS summed 3 numbers
}
