package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// BenchmarkPublishRun publishes b.N tasks and runs each once on a
// consumer at concurrency 32, on the in-memory store: the publish, claim,
// run and finish path of a task with no store I/O, where what tracing
// adds to each task shows.
func BenchmarkPublishRun(b *testing.B) {
	benchPublishRun(b, context.Background())
}

func benchPublishRun(b *testing.B, ctx context.Context) {
	store := memstore.New(memstore.Config{}).Open()
	var ran atomic.Int64
	all := make(chan struct{})
	mux := consumer.NewMux()
	mux.RegisterFunc("noop", func(context.Context, *consumer.Job) error {
		if ran.Add(1) == int64(b.N) {
			close(all)
		}
		return nil
	})
	c, err := consumer.New(consumer.Config{Store: store, Handler: mux, WorkerID: "bench", Concurrency: 32,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	ps := make([]task.PublishParams, b.N)
	for i := range ps {
		ps[i] = task.PublishParams{Key: fmt.Sprintf("t%08d", i), Kind: "noop"}
	}
	b.ReportAllocs()
	b.ResetTimer()
	out, err := task.PublishMany(ctx, store, ps)
	if err != nil || (len(out) > 0 && out[0].Err != nil) {
		b.Fatal(err, out[0].Err)
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d tasks ran", ran.Load(), b.N)
	}
	b.StopTimer()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.Stop(sctx)
}
