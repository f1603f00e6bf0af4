package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/bench"
	"github.com/leasepool/leasepool/store"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure publish-to-start latency, throughput, takeover time and worker memory",
		Description: "Runs producer and worker processes against --store (default: a temporary embedded store).\n" +
			"Latency: tasks published one at a time with a 2 ms gap to an idle worker at concurrency 8.\n" +
			"Throughput: pre-published noop tasks drained by one worker at --concurrency, median of --runs.\n" +
			"Takeover: a worker holding a task is SIGKILLed 3 s in; time until a peer starts it, default lease.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "tasks", Value: bench.DefaultThroughputTasks, Usage: "noop tasks per throughput run"},
			&cli.IntFlag{Name: "latency-tasks", Value: bench.DefaultLatencyTasks, Usage: "tasks per latency run"},
			&cli.IntFlag{Name: "concurrency", Value: bench.DefaultConcurrency, Usage: "worker concurrency in the throughput runs"},
			&cli.IntFlag{Name: "runs", Value: bench.DefaultRuns, Usage: "throughput runs; the median is reported"},
			&cli.IntFlag{Name: "pending", Value: 100000, Usage: "pending tasks for the memory figure (0 skips it)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			&cli.StringFlag{Name: "samples", Usage: "write the raw latency samples (ms) here as JSON {\"in_process\": [...], \"cross_process\": [...]}"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := benchConfig(c)
			if err != nil {
				return err
			}
			// The default --store is for real work: without one given,
			// bench uses a temporary store of its own.
			if c.IsSet("store") || os.Getenv("LEASEPOOL_STORE") != "" {
				cfg.StoreURL = c.String("store")
			} else {
				dir, err := os.MkdirTemp("", "leasepool-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				cfg.StoreURL = "sqlite:" + filepath.Join(dir, "bench.db")
			}
			if cfg.Store, err = openStoreURL(c, cfg.StoreURL, store.Options{}); err != nil {
				return err
			}
			defer cfg.Store.Close()
			res, err := bench.Run(c.Context, cfg)
			if err != nil {
				return err
			}
			if path := c.String("samples"); path != "" {
				data, _ := json.Marshal(res.Samples)
				if err := os.WriteFile(path, data, 0o644); err != nil {
					return fmt.Errorf("--samples: %w", err)
				}
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(res.Report)
			}
			return res.Report.Print(c.App.Writer)
		},
	}
}

// benchConfig reads the bench flags. The bench's worker processes are this
// binary's `worker` command.
func benchConfig(c *cli.Context) (bench.Config, error) {
	for _, f := range []string{"tasks", "latency-tasks", "concurrency", "runs"} {
		if c.Int(f) < 1 {
			return bench.Config{}, fmt.Errorf("--%s: must be at least 1, got %d", f, c.Int(f))
		}
	}
	if c.Int("pending") < 0 {
		return bench.Config{}, fmt.Errorf("--pending: must not be negative")
	}
	exe, err := os.Executable()
	if err != nil {
		return bench.Config{}, err
	}
	cfg := bench.Config{
		LatencyTasks: c.Int("latency-tasks"), ThroughputTasks: c.Int("tasks"),
		Concurrency: c.Int("concurrency"), Runs: c.Int("runs"), PendingTasks: c.Int("pending"),
		Progress: c.App.ErrWriter,
		Logger:   slog.New(minLevel{slog.Default().Handler(), slog.LevelWarn}),
		WorkerCommand: func(storeURL, id string, concurrency int) *exec.Cmd {
			cmd := exec.Command(exe, "--store", storeURL, "--log-level", "error", "worker", "--kinds", "noop,sleep",
				"--id", id, "--concurrency", strconv.Itoa(concurrency))
			cmd.Stderr = os.Stderr
			return cmd
		},
	}
	return cfg, nil
}
