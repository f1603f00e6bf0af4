package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/bench"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure publish-to-start latency, throughput, takeover time and worker memory",
		Description: "Runs producer and worker processes against --store (default: a temporary embedded store).\n" +
			"Latency: tasks published one at a time with a 2 ms gap to an idle worker at concurrency 8.\n" +
			"Throughput: pre-published noop tasks drained by one worker at --concurrency, median of --runs.\n" +
			"Takeover: a worker holding a task is SIGKILLed 3 s in; time until a peer starts it, default lease.",
		Subcommands: []*cli.Command{benchCurveCommand()},
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "tasks", Value: bench.DefaultThroughputTasks, Usage: "noop tasks per throughput run"},
			&cli.IntFlag{Name: "latency-tasks", Value: bench.DefaultLatencyTasks, Usage: "tasks per latency run"},
			&cli.IntFlag{Name: "concurrency", Value: bench.DefaultConcurrency, Usage: "worker concurrency in the throughput runs"},
			&cli.IntFlag{Name: "runs", Value: bench.DefaultRuns, Usage: "throughput runs; the median is reported"},
			&cli.IntFlag{Name: "pending", Value: 100000, Usage: "pending tasks for the memory figure (0 skips it)"},
			&cli.BoolFlag{Name: "throughput-only", Usage: "measure only the worker process's throughput, --runs times"},
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
			prog := newProgress(c.App.ErrWriter)
			cfg.Progress = progressWriter{prog}
			res, err := bench.Run(c.Context, cfg)
			prog.Close()
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
	workerCommand, err := benchWorkerCommand()
	if err != nil {
		return bench.Config{}, err
	}
	cfg := bench.Config{
		LatencyTasks: c.Int("latency-tasks"), ThroughputTasks: c.Int("tasks"),
		Concurrency: c.Int("concurrency"), Runs: c.Int("runs"), PendingTasks: c.Int("pending"), ThroughputOnly: c.Bool("throughput-only"),
		Logger:        slog.New(minLevel{slog.Default().Handler(), slog.LevelWarn}),
		WorkerCommand: workerCommand,
	}
	return cfg, nil
}

// benchWorkerCommand returns the bench's worker processes: this binary's
// `worker` command.
func benchWorkerCommand() (func(storeURL, id string, concurrency int) *exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return func(storeURL, id string, concurrency int) *exec.Cmd {
		cmd := exec.Command(exe, "--store", storeURL, "--log-level", "error", "worker", "--kinds", "noop,sleep",
			"--id", id, "--concurrency", strconv.Itoa(concurrency))
		cmd.Stderr = os.Stderr
		return cmd
	}, nil
}

func benchCurveCommand() *cli.Command {
	return &cli.Command{
		Name:  "curve",
		Usage: "measure how throughput, claim latency and worker memory change with pending tasks, finished tasks and worker processes",
		Description: "On temporary embedded stores: for each --backlogs count of pending noop tasks, each --workers count of\n" +
			"worker processes drains up to --drain of them (the backlog topped up between points) while a probe task of\n" +
			"higher priority is published every 20 ms; a last store adds --finished finished tasks to the smallest backlog.\n" +
			"Throughput is timed from a tenth of the drain to its end; claim latency is the probes' publish to start.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "backlogs", Value: "10000,100000,1000000", Usage: "pending task counts, comma-separated"},
			&cli.StringFlag{Name: "workers", Value: "1,2,4", Usage: "worker process counts, comma-separated"},
			&cli.IntFlag{Name: "finished", Value: bench.DefaultCurveFinished, Usage: "finished tasks beside the smallest backlog (0: no such point)"},
			&cli.IntFlag{Name: "drain", Value: bench.DefaultCurveDrain, Usage: "most tasks drained per point (at most half the backlog)"},
			&cli.IntFlag{Name: "concurrency", Value: bench.DefaultConcurrency, Usage: "concurrency of each worker process"},
			&cli.BoolFlag{Name: "json", Usage: "print the points as a JSON array"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := curveConfig(c)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "leasepool-curve-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			cfg.Dir = dir
			prog := newProgress(c.App.ErrWriter)
			cfg.Progress = progressWriter{prog}
			points, err := bench.Curve(c.Context, cfg)
			prog.Close()
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(points)
			}
			return bench.PrintCurve(c.App.Writer, points)
		},
	}
}

func curveConfig(c *cli.Context) (bench.CurveConfig, error) {
	var cfg bench.CurveConfig
	var err error
	if cfg.Backlogs, err = intList(c, "backlogs", 2); err != nil {
		return cfg, err
	}
	if cfg.Workers, err = intList(c, "workers", 1); err != nil {
		return cfg, err
	}
	for _, f := range []string{"drain", "concurrency"} {
		if c.Int(f) < 1 {
			return cfg, fmt.Errorf("--%s: must be at least 1, got %d", f, c.Int(f))
		}
	}
	if cfg.Finished = c.Int("finished"); cfg.Finished < 0 {
		return cfg, fmt.Errorf("--finished: must not be negative, got %d", cfg.Finished)
	} else if cfg.Finished == 0 {
		cfg.Finished = -1
	}
	if cfg.WorkerCommand, err = benchWorkerCommand(); err != nil {
		return cfg, err
	}
	cfg.Drain, cfg.Concurrency = c.Int("drain"), c.Int("concurrency")
	cfg.OpenStore = func(ctx context.Context, url string) (task.Store, error) {
		return openStoreURL(c, url, store.Options{})
	}
	return cfg, nil
}

// intList parses a comma-separated flag of integers of at least least.
func intList(c *cli.Context, flag string, least int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(c.String(flag), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			return nil, fmt.Errorf("--%s: %q is not a whole number of at least %d", flag, f, least)
		}
		out = append(out, n)
	}
	return out, nil
}
