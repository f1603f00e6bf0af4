package tests

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkDeviceCommands measures device commands per second through the
// whole queue (embedded store, claim with the device lock, MQTT round trip
// to a simulated device, finish) with 20 zero-latency devices, and the bare
// MQTT round trip of one command (the handler called directly, no queue),
// so the queue's overhead per command is the difference.
//
//	go test -run XXX -bench DeviceCommands -benchtime 2000x ./tests/
func BenchmarkDeviceCommands(b *testing.B) {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "bench.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	brk, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(store)})
	if err != nil {
		b.Fatal(err)
	}
	defer brk.Close()
	const devices = 20
	secrets := map[string]string{}
	for i := range devices {
		id := fmt.Sprintf("bench-%d", i)
		if secrets[id], err = credential.Add(ctx, store, id, false); err != nil {
			b.Fatal(err)
		}
	}
	workerSecret, err := credential.WorkerSecret(ctx, store)
	if err != nil {
		b.Fatal(err)
	}
	sim, err := device.NewSimulator(device.Config{BrokerURL: brk.URL(), Count: devices, IDPrefix: "bench-", Seed: 1, Secrets: secrets})
	if err != nil {
		b.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer sim.Stop(ctx)
	h, err := mqttdev.NewHandler(mqttdev.HandlerConfig{ClientConfig: mqttdev.ClientConfig{BrokerURL: brk.URL(), ClientID: broker.ClientID(credential.WorkerUser("bench"), ""),
		Username: credential.WorkerUser("bench"), Password: workerSecret}})
	if err != nil {
		b.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer h.Stop(ctx)
	// The handler learns device states from retained status messages.
	testutil.Eventually(b, 10*time.Second, "the devices to come online", func() bool { return len(h.Tracker().States()) >= devices })

	command := func(key string, i int) (task.PublishParams, error) {
		return mqttdev.PublishParams(key, mqttdev.Command{Device: fmt.Sprintf("bench-%d", i%devices), Command: "noop"}, task.Options{})
	}

	// Bare round trips: the handler alone, one command at a time.
	const bare = 200
	start := time.Now()
	for i := range bare {
		p, err := command(fmt.Sprintf("bare-%d", i), i)
		if err != nil {
			b.Fatal(err)
		}
		doc, err := task.NewTask(p, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Handle(ctx, &consumer.Job{Task: doc, Attempt: 1, WorkerID: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
	roundTrip := time.Since(start) / bare

	b.ResetTimer()
	for i := range b.N {
		p, err := command(fmt.Sprintf("cmd-%d", i), i)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := task.Publish(ctx, store, p); err != nil {
			b.Fatal(err)
		}
	}
	var done atomic.Int64
	finished := make(chan struct{})
	mux := consumer.NewMux()
	mux.Register(mqttdev.Kind, h)
	mux.Use(func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			err := next.Handle(ctx, job)
			if err == nil && done.Add(1) == int64(b.N) {
				close(finished)
			}
			return err
		})
	})
	w, err := consumer.New(consumer.Config{Store: store, Handler: mux, Concurrency: 2 * devices, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	w.Start(ctx)
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d commands finished", done.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	w.Stop(ctx)
	if r := sim.Report(); len(r.Overlaps) > 0 {
		b.Fatalf("%d overlapping commands", len(r.Overlaps))
	}
	perCommand := elapsed / time.Duration(b.N) * devices // each device runs its commands one at a time
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commands/s")
	b.ReportMetric(float64(roundTrip.Microseconds())/1000, "bare-roundtrip-ms")
	b.ReportMetric(float64((perCommand-roundTrip).Microseconds())/1000, "queue-overhead-ms/command")
}
