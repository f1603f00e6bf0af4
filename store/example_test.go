package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// Publish a task, run it in a worker and read its result: the README's
// example, every error checked. The store URL is what --store takes
// (sqlite:PATH, or mongodb://HOST/DB?replicaSet=...).
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "leasepool")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	st, err := store.Open(ctx, "sqlite:"+filepath.Join(dir, "tasks.db"), store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	// Publish is idempotent by key: a second publish of resize-42 leaves it.
	_, res, err := task.Publish(ctx, st, task.PublishParams{
		Key: "resize-42", Kind: "resize", Payload: json.RawMessage(`{"id":42}`),
		Options: task.Options{Priority: 5, MaxUnexpectedRetries: 2},
	})
	if err != nil {
		log.Fatal(err) // errors.Is(err, task.ErrInvalid): the message names the field; nothing was written
	}
	fmt.Println("publish:", res)

	ran := make(chan struct{})
	mux := consumer.NewMux()
	mux.RegisterFunc("resize", func(ctx context.Context, job *consumer.Job) error {
		defer close(ran)
		var p struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal(job.Task.Payload, &p); err != nil {
			return err // a failed attempt: retried after a backoff, up to MaxUnexpectedRetries
		}
		// ctx ends on lease loss, cancel or shutdown; context.Cause(ctx)
		// is task.ErrLeaseLost, task.ErrCancelled or consumer.ErrShutdown.
		job.Logf("resizing image %d", p.ID)
		return job.SetResult(map[string]int{"id": p.ID, "bytes": 1024})
	})

	w, err := consumer.New(consumer.Config{Store: st, Handler: mux, Concurrency: 16,
		RetryPolicy: consumer.ExponentialBackoff(time.Second, 5*time.Minute)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err) // errors.Is(err, task.ErrWorkerIDTaken): another live process has this worker id
	}
	<-ran
	// Graceful stop: running handlers finish and their outcomes are
	// written, then leases are released.
	if err := w.Stop(ctx); err != nil {
		log.Fatal(err)
	}

	t, err := st.Get(ctx, "resize-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("state:", t.State, "result:", string(t.Result()))
	// Output:
	// publish: inserted
	// state: succeeded result: {"bytes":1024,"id":42}
}
