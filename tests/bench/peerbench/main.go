// Command peerbench measures leasepool's peers the way `leasepool bench`
// measures leasepool: publish-to-start latency across processes, throughput
// of one worker process, takeover after SIGKILL with default settings, and
// worker memory.
//
//	peerbench bench -system river|asynq -url URL -out DIR [-quick] [...]
//	peerbench worker -system river|asynq -url URL -concurrency N -record FILE   (spawned by bench)
//	peerbench report -dir DIR -md FILE -png FILE [-command CMD]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peerbench bench|worker|report|curve [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "bench":
		err = benchMain(os.Args[2:])
	case "worker":
		err = workerMain(os.Args[2:])
	case "report":
		err = reportMain(os.Args[2:])
	case "curve":
		err = curveMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}

func benchMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	system := fs.String("system", "", "river or asynq")
	url := fs.String("url", "", "postgres:// URL for river, redis:// URL for asynq")
	out := fs.String("out", ".", "directory for SYSTEM.json, SYSTEM.samples.json and worker logs")
	quick := fs.Bool("quick", false, "development run: 2,000 throughput jobs, 1 run, 10,000 pending")
	tasks := fs.Int("tasks", 20000, "noop jobs per throughput run")
	latencyTasks := fs.Int("latency-tasks", 2000, "jobs in the latency run")
	concurrency := fs.Int("concurrency", 32, "worker concurrency in the throughput runs")
	runs := fs.Int("runs", 3, "throughput runs; the median is reported")
	pending := fs.Int("pending", 100000, "pending jobs for the memory figure (0 skips it)")
	capWait := fs.Duration("takeover-cap", 180*time.Second, "longest wait for the takeover")
	throughputOnly := fs.Bool("throughput-only", false, "measure only the throughput, -runs times (tests/bench/run's interleaved rounds)")
	tuned := fs.Bool("tuned", false, "tuned for latency as a user would: River FetchCooldown 1 ms, Asynq TaskCheckInterval 1 ms (reported as SYSTEM-tuned)")
	fs.Parse(args)
	if *quick {
		*tasks, *runs, *pending = 2000, 1, 10000
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	name := *system
	if *tuned {
		name += "-tuned"
	}
	h := &harness{ctx: ctx, system: *system, name: name, tuned: *tuned, url: *url, dir: *out, runs: *runs, cap: *capWait, throughputOnly: *throughputOnly,
		r: report{System: name, LatencyTasks: *latencyTasks, ThroughputTasks: *tasks,
			Concurrency: *concurrency, PendingTasks: *pending}}
	var err error
	switch *system {
	case "river":
		h.p, err = openRiver(ctx, *url)
		h.r.Store = "PostgreSQL (riverpgxv5, pgxpool defaults)"
		h.r.TakeoverNote = "default rescue: RescueStuckJobsAfter = JobTimeout (1 min) + 1 h"
		h.r.LatencyNote = "FetchCooldown default 100 ms: a worker fetches at most MaxWorkers jobs per 100 ms (80/s at concurrency 8, 320/s at 32), which River documents as limiting throughput; the latency run publishes 500/s, so its queue grows"
		if *tuned {
			h.r.SettingsChanged = append(h.r.SettingsChanged, "FetchCooldown 1 ms (default 100 ms)")
			h.r.LatencyNote = "tuned: FetchCooldown 1 ms"
		}
	case "asynq":
		h.p, err = openAsynq(ctx, *url)
		h.r.Store = "Redis"
		h.r.TakeoverNote = "default: 30 s lease, recoverer every 1 min, then retry delay 15-45 s"
		h.r.LatencyNote = "TaskCheckInterval default 1 s: a worker that finds the queue empty sleeps 1 s before it looks again"
		if *tuned {
			h.r.SettingsChanged = append(h.r.SettingsChanged, "TaskCheckInterval 1 ms (default 1 s)")
			h.r.LatencyNote = "tuned: TaskCheckInterval 1 ms"
		}
	default:
		return fmt.Errorf("-system: want river or asynq, got %q", *system)
	}
	if err != nil {
		return err
	}
	defer h.p.Close()
	if err := h.p.Reset(ctx); err != nil {
		return err
	}
	if err := h.run(); err != nil {
		return err
	}
	return writeJSON(filepath.Join(*out, name+".json"), h.r)
}

func workerMain(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	system := fs.String("system", "", "river or asynq")
	url := fs.String("url", "", "server URL")
	concurrency := fs.Int("concurrency", 8, "jobs at once")
	record := fs.String("record", "", "append \"ID UNIXNANO\" here at each job start")
	tuned := fs.Bool("tuned", false, "tuned for latency (see bench -tuned)")
	fs.Parse(args)
	rec, err := newRecorder(*record)
	if err != nil {
		return err
	}
	ctx := context.Background()
	switch *system {
	case "river":
		return riverWorker(ctx, *url, *concurrency, *tuned, rec)
	case "asynq":
		return asynqWorker(ctx, *url, *concurrency, *tuned, rec)
	}
	return fmt.Errorf("-system: want river or asynq, got %q", *system)
}

// depVersions reads the versions of modules built into this program.
func depVersions(paths ...string) map[string]string {
	out := map[string]string{}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return out
	}
	for _, d := range info.Deps {
		for _, p := range paths {
			if d.Path == p {
				out[p] = d.Version
			}
		}
	}
	out["go"] = info.GoVersion
	return out
}
