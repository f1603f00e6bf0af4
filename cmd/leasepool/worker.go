package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
)

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "claim and run tasks until SIGINT or SIGTERM",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "worker id (default host-pid-random)"},
			&cli.StringFlag{Name: "kinds", Usage: "comma-separated kinds to run (default all built-in kinds)"},
			&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "handlers running at once"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second,
				Usage: "on SIGINT/SIGTERM, how long running handlers may finish before they are cancelled and their leases released"},
		},
		Action: func(c *cli.Context) error {
			if c.Int("concurrency") < 1 {
				return fmt.Errorf("--concurrency: must be at least 1, got %d", c.Int("concurrency"))
			}
			if _, err := positiveDuration(c, "shutdown-timeout"); err != nil {
				return err
			}
			mux := consumer.NewMux()
			builtin.Register(mux)
			kinds := splitList(c.String("kinds"))
			for _, k := range kinds {
				if !slices.Contains(mux.Kinds(), k) {
					return fmt.Errorf("--kinds: %q is not a kind this worker can run (%v)", k, builtin.Kinds)
				}
			}
			s, err := openStore(c, false)
			if err != nil {
				return err
			}
			defer s.Close()
			w, err := consumer.New(consumer.Config{
				Store: s, Handler: mux, WorkerID: c.String("id"), Kinds: kinds,
				Concurrency: c.Int("concurrency"), ShutdownTimeout: c.Duration("shutdown-timeout"),
				Logger: slog.Default(),
			})
			if err != nil {
				return fmt.Errorf("--id: %w", err)
			}
			if err := w.Start(context.WithoutCancel(c.Context)); err != nil {
				return err
			}
			<-c.Context.Done() // SIGINT or SIGTERM
			slog.Info("shutting down: finishing running tasks", slog.Duration("timeout", c.Duration("shutdown-timeout")))
			return w.Stop(context.Background())
		},
	}
}
