package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "run three worker processes on a temporary embedded store and broker with simulated devices, kill one mid-run, and check every task ended as it should",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "tasks", Value: 300, Usage: "how many plain tasks to publish (at least 50)"},
			&cli.IntFlag{Name: "devices", Value: 20, Usage: "simulated devices (a third of them flaky); 0 for none"},
			&cli.IntFlag{Name: "commands", Value: 200, Usage: "device commands to publish"},
			&cli.DurationFlag{Name: "kill-after", Value: 1500 * time.Millisecond, Usage: "when to SIGKILL the first worker"},
			&cli.DurationFlag{Name: "deadline", Value: 2 * time.Minute, Usage: "give up after this long"},
			&cli.BoolFlag{Name: "keep", Usage: "keep the temporary store and logs (kept anyway when the demo fails) and print their paths"},
		},
		Action: func(c *cli.Context) error {
			if c.Int("tasks") < 50 {
				return fmt.Errorf("--tasks: must be at least 50, got %d", c.Int("tasks"))
			}
			for _, f := range []string{"kill-after", "deadline"} {
				if _, err := positiveDuration(c, f); err != nil {
					return err
				}
			}
			if c.Int("devices") < 0 || c.Int("commands") < 0 {
				return fmt.Errorf("--devices and --commands: must not be negative")
			}
			return runDemo(c.Context, c.App.Writer, demoConfig{
				tasks: c.Int("tasks"), devices: c.Int("devices"), commands: c.Int("commands"),
				killAfter: c.Duration("kill-after"), deadline: c.Duration("deadline"), keep: c.Bool("keep"),
			})
		},
	}
}

// demoTask is one published task and the state it must end in.
type demoTask struct {
	params task.PublishParams
	want   task.State
	group  string
}

func demoTasks(n int) []demoTask {
	sleep := func(d time.Duration, fail bool) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"duration": d.String(), "fail": fail})
		return b
	}
	fast := task.Options{PingInterval: 200 * time.Millisecond, WorkerTimeout: time.Second}
	var out []demoTask
	add := func(group string, want task.State, kind string, payload json.RawMessage, opts task.Options) {
		key := fmt.Sprintf("%s-%03d", group, len(out))
		out = append(out, demoTask{params: task.PublishParams{Key: key, Kind: kind, Payload: payload, Options: opts}, want: want, group: group})
	}
	for i := range n {
		opts := fast
		switch i % 10 {
		case 0: // long enough that the killed worker holds some: peers take over
			add("long", task.StateSucceeded, "sleep", sleep(1500*time.Millisecond, false), opts)
		case 1: // delayed
			opts.RunAt = time.Now().Add(time.Duration(1+i%3) * time.Second)
			add("delayed", task.StateSucceeded, "sleep", sleep(20*time.Millisecond, false), opts)
		case 2: // pinned to the workers that survive
			opts.SpecificWorkerIDs = []string{"demo-w2", "demo-w3"}
			add("pinned", task.StateSucceeded, "sleep", sleep(30*time.Millisecond, false), opts)
		case 3: // three workers at once, two successes finish it
			opts.ConcurrentWorkerCnt, opts.SuccessWorkerCnt = 3, 2
			add("multi", task.StateSucceeded, "sleep", sleep(300*time.Millisecond, false), opts)
		case 4: // fails every time: retries exhausted, reported failed
			opts.MaxUnexpectedRetries = 1
			add("failing", task.StateFailed, "sleep", sleep(10*time.Millisecond, true), opts)
		case 5: // one shared resource: runs one at a time
			opts.LockKeys = []string{"printer"}
			add("locked", task.StateSucceeded, "sleep", sleep(20*time.Millisecond, false), opts)
		default:
			opts.Priority = i % 7
			add("plain", task.StateSucceeded, "sleep", sleep(time.Duration(10+i%90)*time.Millisecond, false), opts)
		}
	}
	return out
}

type demoConfig struct {
	tasks, devices, commands int
	killAfter, deadline      time.Duration
	keep                     bool
}

// demoDevices starts the embedded broker and the simulated devices: two
// thirds reliable, a third flaky (failing, dropping acks, going offline).
// The broker checks the credentials in s: each device gets its own there,
// and the workers log in with the store's worker secret. They log to
// logger.
func demoDevices(ctx context.Context, s task.Store, n int, logger *slog.Logger) (url string, sims []*device.Simulator, stop func(), err error) {
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(s), Logger: logger})
	if err != nil {
		return "", nil, nil, err
	}
	stop = func() {
		for _, s := range sims {
			s.Stop(context.Background())
		}
		b.Close()
	}
	flaky := n / 3
	for _, cfg := range []device.Config{
		{BrokerURL: b.URL(), Count: n - flaky, IDPrefix: "dev-", Latency: 30 * time.Millisecond, Seed: 1, Logger: logger},
		{BrokerURL: b.URL(), Count: flaky, IDPrefix: "flaky-", Latency: 30 * time.Millisecond, Seed: 2, Logger: logger,
			FailRate: 0.15, DropAckRate: 0.1, OfflineRate: 0.05, OfflineFor: time.Second, Heartbeat: time.Second},
	} {
		if cfg.Count == 0 {
			continue
		}
		cfg.Secrets = map[string]string{}
		for i := range cfg.Count {
			id := cfg.IDPrefix + strconv.Itoa(i)
			if cfg.Secrets[id], err = credential.AddSimulated(ctx, s, id); err != nil {
				stop()
				return "", nil, nil, fmt.Errorf("simulated device %s: %w", id, err)
			}
		}
		sim, err := device.NewSimulator(cfg)
		if err == nil {
			err = sim.Start(ctx)
		}
		if err != nil {
			stop()
			return "", nil, nil, fmt.Errorf("simulated devices: %w", err)
		}
		sims = append(sims, sim)
	}
	return b.URL(), sims, stop, nil
}

// demoCommands are device commands spread over the simulated devices.
func demoCommands(devices, n int) ([]demoTask, error) {
	flaky := devices / 3
	var out []demoTask
	for i := range n {
		d := i % devices
		id, group := fmt.Sprintf("dev-%d", d), "device"
		opts := task.Options{PingInterval: 200 * time.Millisecond, WorkerTimeout: time.Second, Priority: i % 3}
		if d >= devices-flaky {
			id, group = fmt.Sprintf("flaky-%d", d-(devices-flaky)), "flaky"
			opts.MaxUnexpectedRetries = 10 // fails 15% of the time: retried until it works
		}
		cmd := mqttdev.Command{Device: id, Command: "blink", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			AckTimeout: task.Duration(500 * time.Millisecond), ResultTimeout: task.Duration(3 * time.Second)}
		p, err := mqttdev.PublishParams(fmt.Sprintf("%s-cmd-%03d", group, i), cmd, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, demoTask{params: p, want: task.StateSucceeded, group: group})
	}
	return out, nil
}

func runDemo(ctx context.Context, w io.Writer, cfg demoConfig) (err error) {
	dir, err := os.MkdirTemp("", "leasepool-demo-")
	if err != nil {
		return err
	}
	storeURL := "sqlite:" + filepath.Join(dir, "demo.db")
	// The logs of every part (store, broker, devices, worker processes)
	// go to a file, at info: the demo's output is its own, and the file
	// is there to look into.
	logPath := filepath.Join(dir, "demo.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	defer func() {
		logFile.Close()
		// A failed demo keeps its store and logs to look into.
		if cfg.keep || (err != nil && !errors.Is(err, context.Canceled)) {
			fmt.Fprintf(w, "kept the store (%s) and the logs (%s)\n", storeURL, logPath)
			return
		}
		os.RemoveAll(dir)
	}()
	logger := slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fmt.Fprintf(w, "logs of the store, broker, devices and workers: %s (removed at the end unless the demo fails or --keep)\n", logPath)
	s, err := store.Open(ctx, storeURL, store.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer s.Close()

	tasks := demoTasks(cfg.tasks)
	// A short retry backoff: at the default (1 s, doubling) a flaky
	// device's command that failed three times would wait 7 s, longer
	// than all the rest of the demo.
	workerArgs := []string{"--concurrency", "8", "--backoff", "250ms"}
	var sims []*device.Simulator
	if cfg.devices > 0 && cfg.commands > 0 {
		url, started, stop, err := demoDevices(ctx, s, cfg.devices, logger)
		if err != nil {
			return err
		}
		defer stop()
		sims = started
		workerArgs = append(workerArgs, "--mqtt", url)
		cmds, err := demoCommands(cfg.devices, cfg.commands)
		if err != nil {
			return err
		}
		tasks = append(tasks, cmds...)
		fmt.Fprintf(w, "embedded MQTT broker on %s; %d simulated devices (%d flaky)\n", url, cfg.devices, cfg.devices/3)
	} else {
		workerArgs = append(workerArgs, "--kinds", "noop,sleep")
	}
	want := map[string]demoTask{}
	for _, dt := range tasks {
		if _, _, err := task.Publish(ctx, s, dt.params); err != nil {
			return err
		}
		want[dt.params.Key] = dt
	}
	fmt.Fprintf(w, "published %d tasks: plain, delayed, pinned to demo-w2/demo-w3, 3-worker, failing, locked on one resource, long, device commands\n", len(tasks))
	withDevices := cfg.devices >= 3 && cfg.commands > 0
	if err := publishDemoFlows(ctx, w, s, withDevices); err != nil {
		return err
	}

	workers, err := startDemoWorkers(storeURL, workerArgs, logFile)
	defer stopDemoWorkers(workers)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "started workers demo-w1, demo-w2, demo-w3")

	start := time.Now()
	flowsEnded := func(ctx context.Context) (bool, error) { return demoFlowsEnded(ctx, s, withDevices) }
	final, err := demoWatch(ctx, w, s, workers["demo-w1"], flowsEnded, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nall %d tasks (with flow steps and documents) finished in %.1fs\n\n", len(final), time.Since(start).Seconds())
	err = errors.Join(demoSummary(w, final, want), demoDeviceSummary(w, sims), demoFlowSummary(ctx, w, s, withDevices))
	if err == nil {
		fmt.Fprintln(w, "\nOK: every task ended as it should")
	}
	return err
}

// startDemoWorkers starts the three worker processes, this binary's
// `worker` command, logging at info to logs.
func startDemoWorkers(storeURL string, workerArgs []string, logs *os.File) (map[string]*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	workers := map[string]*exec.Cmd{}
	for _, id := range []string{"demo-w1", "demo-w2", "demo-w3"} {
		args := append([]string{"--store", storeURL, "--log-level", "info", "worker", "--id", id}, workerArgs...)
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			return workers, fmt.Errorf("start worker %s: %w", id, err)
		}
		workers[id] = cmd
	}
	return workers, nil
}

func stopDemoWorkers(workers map[string]*exec.Cmd) {
	for _, cmd := range workers {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	}
}

// demoWatch shows the task counts as they change (every 250 ms on a
// terminal, a line every few seconds elsewhere) and, when nothing runs,
// what the pending tasks wait for; it SIGKILLs victim after cfg.killAfter,
// and returns the tasks once every one has finished and flowsEnded says
// every flow has too.
func demoWatch(ctx context.Context, w io.Writer, s task.Store, victim *exec.Cmd, flowsEnded func(context.Context) (bool, error), cfg demoConfig) ([]*task.Task, error) {
	start := time.Now()
	killed := false
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	prog := newProgress(w)
	defer prog.Close()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		if !killed && time.Since(start) >= cfg.killAfter {
			killed = true
			victim.Process.Kill()
			victim.Wait()
			prog.Println(fmt.Sprintf("killed demo-w1 with SIGKILL at %.1fs; its tasks pass to peers when their leases expire", time.Since(start).Seconds()))
		}
		all, err := s.List(ctx, task.ListQuery{})
		if err != nil {
			return nil, err
		}
		counts := map[task.State]int{}
		for _, t := range all {
			counts[t.State]++
		}
		done := counts[task.StateSucceeded] + counts[task.StateFailed] + counts[task.StateCancelled]
		status := fmt.Sprintf("%5.1fs  pending %3d  running %3d  succeeded %3d  failed %3d  (%d/%d done)",
			time.Since(start).Seconds(), counts[task.StatePending], counts[task.StateRunning],
			counts[task.StateSucceeded], counts[task.StateFailed], done, len(all))
		if counts[task.StatePending] > 0 && counts[task.StateRunning] == 0 {
			ws, err := s.Workers(ctx)
			if err != nil {
				return nil, err
			}
			now := s.Now()
			ws = slices.DeleteFunc(ws, func(w task.WorkerInfo) bool { return !w.Live(now) })
			offline, err := offlineDevices(ctx, s)
			if err != nil {
				return nil, err
			}
			status += "  " + waitSummary(all, ws, offline, now)
		}
		prog.Status(status)
		if done == len(all) && killed {
			ended, err := flowsEnded(ctx)
			if err != nil {
				return nil, err
			}
			if ended {
				return all, nil
			}
		}
		if time.Since(start) > cfg.deadline {
			return nil, fmt.Errorf("demo: not every task and flow finished within %s", cfg.deadline)
		}
	}
}

// demoDeviceSummary prints what the simulated devices saw and fails if
// one ran two commands at once.
func demoDeviceSummary(w io.Writer, sims []*device.Simulator) error {
	if len(sims) == 0 {
		return nil
	}
	var runs, overlaps, stale, devices int
	for _, sim := range sims {
		r := sim.Report()
		runs += len(r.Runs)
		overlaps += len(r.Overlaps)
		stale += len(r.StaleAttempts)
		devices += len(r.Devices)
	}
	fmt.Fprintf(w, "  devices: %d ran %d commands; a device ran two at once %d times; stale attempts refused %d\n", devices, runs, overlaps, stale)
	if overlaps > 0 {
		return errors.New("demo: a device ran two commands at once")
	}
	return nil
}

// demoSummary checks every task against what it should have become and
// prints what the run showed.
func demoSummary(w io.Writer, final []*task.Task, want map[string]demoTask) error {
	var problems []string
	byGroup := map[string][2]int{}
	takeovers := 0
	for _, t := range final {
		dt, ok := want[t.Key]
		if !ok {
			continue // flow steps and flow documents
		}
		g := byGroup[dt.group]
		g[1]++
		if t.State == dt.want {
			g[0]++
		} else {
			problems = append(problems, fmt.Sprintf("%s ended %s, want %s", t.Key, t.State, dt.want))
		}
		byGroup[dt.group] = g
		for _, wk := range t.Attempts {
			if wk.State == task.AttemptExpired {
				takeovers++
			}
			if dt.group == "pinned" && wk.WorkerID != "demo-w2" && wk.WorkerID != "demo-w3" {
				problems = append(problems, fmt.Sprintf("%s ran on %s, which it is not pinned to", t.Key, wk.WorkerID))
			}
		}
		if dt.group == "multi" {
			ok := 0
			for _, wk := range t.Attempts {
				if wk.State == task.AttemptSuccess {
					ok++
				}
			}
			if ok < 2 {
				problems = append(problems, fmt.Sprintf("%s has %d successful workers, want 2", t.Key, ok))
			}
		}
	}
	// No overlap check on the "printer" lock from the stored times: an
	// attempt's started_at is its claim's time, taken before its lock take,
	// which may wait for the previous holder's release (a busy store), so
	// stored intervals can touch while the runs never did. The devices'
	// own reports below are the run-side check of one-at-a-time.
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		fmt.Fprintf(w, "  %-8s %3d/%-3d as expected (%s)\n", g, byGroup[g][0], byGroup[g][1], want[firstKey(want, g)].want)
	}
	fmt.Fprintf(w, "  leases taken over from the killed worker: %d\n", takeovers)
	if len(problems) > 0 {
		fmt.Fprintln(w, "\nPROBLEMS:")
		for _, p := range problems {
			fmt.Fprintln(w, "  "+p)
		}
		return errors.New("demo: some tasks did not end as they should")
	}
	return nil
}

func firstKey(want map[string]demoTask, group string) string {
	for k, dt := range want {
		if dt.group == group {
			return k
		}
	}
	return ""
}
