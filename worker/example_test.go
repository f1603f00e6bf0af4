package worker_test

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
	"github.com/leasepool/leasepool/worker"
)

// A program of your own that runs what `leasepool worker` runs, plus a
// kind of its own: every error checked.
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

	mux := consumer.NewMux()
	mux.RegisterFunc("resize", func(ctx context.Context, job *consumer.Job) error {
		return job.SetResult(map[string]int{"bytes": 1024})
	})
	// Kinds: your own, and the built-in noop. Exec would run only if named
	// here (worker.Config.Exec configures it).
	w, err := worker.New(worker.Config{Store: st, Mux: mux, Kinds: []string{"resize", "noop"}, ID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for _, key := range []string{"resize-1", "ping-1"} {
		kind := map[string]string{"resize-1": "resize", "ping-1": "noop"}[key]
		if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: key, Kind: kind, Payload: json.RawMessage(`{}`)}); err != nil {
			log.Fatal(err)
		}
	}
	for _, key := range []string{"resize-1", "ping-1"} {
		t, err := waitFinished(ctx, st, key)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(key, t.State, string(t.Result()))
	}
	if err := w.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// resize-1 succeeded {"bytes":1024}
	// ping-1 succeeded
}

// waitFinished polls the task until it has finished.
func waitFinished(ctx context.Context, st task.Store, key string) (*task.Task, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		t, err := st.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		if t.State.Finished() {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", key, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
