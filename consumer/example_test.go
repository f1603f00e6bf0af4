package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// A worker: register handlers by kind on a Mux, start a Consumer on a
// store, publish, and stop gracefully.
func Example() {
	dir, _ := os.MkdirTemp("", "leasepool")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "tasks.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	done := make(chan string)
	mux := consumer.NewMux()
	mux.Use(func(next consumer.Handler) consumer.Handler { // middleware: around every run
		return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			err := next.Handle(ctx, job)
			done <- fmt.Sprintf("%s attempt %d: err=%v", job.Task.Key, job.Attempt, err)
			return err
		})
	})
	mux.RegisterFunc("greet", func(ctx context.Context, job *consumer.Job) error {
		// ctx ends on lease loss, cancel or shutdown: context.Cause says which.
		return nil
	})
	w, err := consumer.New(consumer.Config{Store: store, Handler: mux, WorkerID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer w.Stop(ctx) // graceful: running handlers finish, then leases are released

	if _, _, err := task.Publish(ctx, store, task.PublishParams{Key: "hello-1", Kind: "greet"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-done)
	// Output:
	// hello-1 attempt 1: err=<nil>
}

// Publish is idempotent by key; Cancel stops a task wherever it runs;
// Retry runs a finished task again.
func Example_publishCancelRetry() {
	dir, _ := os.MkdirTemp("", "leasepool")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "tasks.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	p := task.PublishParams{Key: "resize-42", Kind: "resize", Options: task.Options{Priority: 5}}
	_, res, _ := task.Publish(ctx, store, p)
	fmt.Println("publish:", res)
	_, res, _ = task.Publish(ctx, store, p)
	fmt.Println("again:", res)

	t, _ := task.Cancel(ctx, store, "resize-42")
	fmt.Println("cancel:", t.State)
	_, err = task.Cancel(ctx, store, "resize-42")
	fmt.Println("cancel again:", errors.Is(err, task.ErrFinished))

	t, _ = task.Retry(ctx, store, "resize-42")
	fmt.Println("retry:", t.State)

	_, _, err = task.Publish(ctx, store, task.PublishParams{Key: "", Kind: "resize"})
	fmt.Println(errors.Is(err, task.ErrInvalid), err)
	// Output:
	// publish: inserted
	// again: existing
	// cancel: cancelled
	// cancel again: true
	// retry: pending
	// true invalid: key: must not be empty
}
