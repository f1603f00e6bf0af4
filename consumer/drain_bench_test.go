package consumer_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkDrain is the claim path alone, for profiles: one consumer at
// concurrency 32 drains b.N pre-published noop tasks from an embedded
// store, as `leasepool bench`'s throughput run does in a worker process.
//
//	go test -run '^$' -bench Drain -benchtime 20000x -cpuprofile cpu.prof ./consumer
func BenchmarkDrain(b *testing.B) {
	ctx := context.Background()
	dbPath := filepath.Join(b.TempDir(), "tasks.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	// Published by 32 goroutines, so that the inserts share commits and
	// a profile shows the drain.
	var g errgroup.Group
	g.SetLimit(32)
	for i := range b.N {
		g.Go(func() error {
			_, _, err := task.Publish(ctx, store, task.PublishParams{Key: "t" + strconv.Itoa(i), Kind: "noop"})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	var finished atomic.Int64
	drained := make(chan struct{})
	mux := consumer.NewMux()
	mux.RegisterFunc("noop", func(context.Context, *consumer.Job) error {
		if finished.Add(1) == int64(b.N) {
			close(drained)
		}
		return nil
	})
	w, err := consumer.New(consumer.Config{Store: store, Handler: mux, Concurrency: 32, WorkerID: "drain",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := cpuTime(b)
	start := time.Now()
	if err := w.Start(ctx); err != nil {
		b.Fatal(err)
	}
	select {
	case <-drained:
	case <-time.After(5 * time.Minute):
		b.Fatal("not drained in 5 minutes")
	}
	elapsed := time.Since(start)
	cpu := cpuTime(b) - cpu0
	b.StopTimer()
	w.Stop(ctx)
	if fi, err := os.Stat(dbPath + "-wal"); err == nil {
		b.Logf("WAL %d bytes", fi.Size())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tasks/s")
	// CPU per task moves less than tasks/s on a machine doing other work.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/task")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
