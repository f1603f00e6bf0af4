// Command resizeworker is a library user's worker: one kind of its own,
// "resize", registered on a consumer.Mux and run until SIGTERM against the
// store its --store flag names.
//
//	resizeworker --store sqlite:PATH --id resize-1
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/store"
)

func main() {
	storeURL := flag.String("store", "", "store URL")
	id := flag.String("id", "resize-1", "worker id")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := store.Open(ctx, *storeURL, store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	mux := consumer.NewMux()
	mux.RegisterFunc("resize", func(ctx context.Context, job *consumer.Job) error {
		var p struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal(job.Task.Payload, &p); err != nil {
			return fmt.Errorf("resize payload: %w", err)
		}
		return job.SetResult(map[string]any{"resized": p.ID, "by": *id})
	})
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: *id})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	if err := w.Stop(context.Background()); err != nil {
		log.Fatal(err)
	}
}
