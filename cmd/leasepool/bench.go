package main

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// benchReport is what `leasepool bench --json` prints. Every name carries
// its unit.
type benchReport struct {
	Store                      string  `json:"store"`
	LatencyTasks               int     `json:"latency_tasks"`
	InProcessP50Ms             float64 `json:"publish_to_start_in_process_p50_ms"`
	InProcessP90Ms             float64 `json:"publish_to_start_in_process_p90_ms"`
	InProcessP99Ms             float64 `json:"publish_to_start_in_process_p99_ms"`
	InProcessMaxMs             float64 `json:"publish_to_start_in_process_max_ms"`
	CrossProcessP50Ms          float64 `json:"publish_to_start_cross_process_p50_ms"`
	CrossProcessP90Ms          float64 `json:"publish_to_start_cross_process_p90_ms"`
	CrossProcessP99Ms          float64 `json:"publish_to_start_cross_process_p99_ms"`
	CrossProcessMaxMs          float64 `json:"publish_to_start_cross_process_max_ms"`
	ThroughputTasks            int     `json:"throughput_tasks"`
	Concurrency                int     `json:"concurrency"`
	InProcessThroughputPerS    float64 `json:"throughput_in_process_per_s"`
	CrossProcessThroughputPerS float64 `json:"throughput_worker_process_per_s"`
	TakeoverMs                 float64 `json:"takeover_after_sigkill_ms"`
	DefaultWorkerTimeoutMs     float64 `json:"default_worker_timeout_ms"`
	WorkerPeakRSSBytes         int64   `json:"worker_peak_rss_throughput_bytes"`
	WorkerIdleRSSBytes         int64   `json:"worker_rss_idle_bytes"`
	PendingTasks               int     `json:"pending_tasks"`
	WorkerRSSWithPendingBytes  int64   `json:"worker_rss_with_pending_bytes"`
}

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure publish-to-start latency, throughput, takeover time and worker memory",
		Description: "Runs producer and worker processes against --store (default: a temporary embedded store).\n" +
			"Latency: tasks published one at a time with a 2 ms gap to an idle worker at concurrency 8.\n" +
			"Throughput: pre-published noop tasks drained by one worker at --concurrency, median of --runs.\n" +
			"Takeover: a worker holding a task is SIGKILLed 3 s in; time until a peer starts it, default lease.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "tasks", Value: 20000, Usage: "noop tasks per throughput run"},
			&cli.IntFlag{Name: "latency-tasks", Value: 2000, Usage: "tasks per latency run"},
			&cli.IntFlag{Name: "concurrency", Value: 32, Usage: "worker concurrency in the throughput runs"},
			&cli.IntFlag{Name: "runs", Value: 3, Usage: "throughput runs; the median is reported"},
			&cli.IntFlag{Name: "pending", Value: 100000, Usage: "pending tasks for the memory figure (0 skips it)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			&cli.StringFlag{Name: "samples", Usage: "write the raw latency samples (ms) here as JSON {\"in_process\": [...], \"cross_process\": [...]}"},
		},
		Action: func(c *cli.Context) error {
			for _, f := range []string{"tasks", "latency-tasks", "concurrency", "runs"} {
				if c.Int(f) < 1 {
					return fmt.Errorf("--%s: must be at least 1, got %d", f, c.Int(f))
				}
			}
			if c.Int("pending") < 0 {
				return fmt.Errorf("--pending: must not be negative")
			}
			b := &bench{
				ctx: c.Context, out: c.App.ErrWriter, storeURL: c.String("store"),
				report: benchReport{LatencyTasks: c.Int("latency-tasks"), ThroughputTasks: c.Int("tasks"),
					Concurrency: c.Int("concurrency"), PendingTasks: c.Int("pending")},
			}
			if !c.IsSet("store") && os.Getenv("LEASEPOOL_STORE") == "" {
				dir, err := os.MkdirTemp("", "leasepool-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				b.storeURL = "sqlite:" + filepath.Join(dir, "bench.db")
			}
			b.report.Store = b.storeURL
			if err := b.run(c.Int("runs")); err != nil {
				return err
			}
			if path := c.String("samples"); path != "" {
				data, _ := json.Marshal(map[string][]float64{"in_process": b.inProcess, "cross_process": b.crossProcess})
				if err := os.WriteFile(path, data, 0o644); err != nil {
					return fmt.Errorf("--samples: %w", err)
				}
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(b.report)
			}
			return b.print(c.App.Writer)
		},
	}
}

type bench struct {
	ctx      context.Context
	out      io.Writer // progress
	storeURL string
	store    task.Store
	report   benchReport
	round    int
	// raw publish-to-start samples in ms, sorted
	inProcess, crossProcess []float64
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.out, "\r\033[K"+format, args...)
}

func (b *bench) run(runs int) error {
	var err error
	if b.store, err = openStoreURL(b.ctx, b.storeURL, false); err != nil {
		return err
	}
	defer b.store.Close()
	steps := []struct {
		name string
		fn   func() error
	}{
		{"latency in one process", b.latencyInProcess},
		{"latency across processes", b.latencyCrossProcess},
		{"throughput", func() error { return b.throughput(runs) }},
		{"takeover", b.takeover},
		{"memory with pending tasks", b.pendingMemory},
	}
	for _, s := range steps {
		b.progress("%s...", s.name)
		if err := s.fn(); err != nil {
			return fmt.Errorf("bench %s: %w", s.name, err)
		}
	}
	b.progress("done\n")
	return nil
}

func (b *bench) keyPrefix(what string) string {
	b.round++
	return fmt.Sprintf("bench-%d-%s-%d-", os.Getpid(), what, b.round)
}

// publishPaced publishes n noop tasks one at a time with gap between them
// and returns when each publish call returned.
func (b *bench) publishPaced(prefix string, n int, gap time.Duration) (map[string]time.Time, error) {
	published := make(map[string]time.Time, n)
	next := time.Now()
	for i := range n {
		key := prefix + strconv.Itoa(i)
		if _, _, err := task.Publish(b.ctx, b.store, task.PublishParams{Key: key, Kind: "noop"}); err != nil {
			return nil, err
		}
		published[key] = time.Now()
		if i%100 == 0 {
			b.progress("latency: %d/%d published", i, n)
		}
		next = next.Add(gap)
		time.Sleep(time.Until(next))
	}
	return published, nil
}

func (b *bench) latencyInProcess() error {
	var mu sync.Mutex
	started := map[string]time.Time{}
	w, err := b.worker(8, func(job *consumer.Job) {
		at := time.Now()
		mu.Lock()
		started[job.Task.Key] = at
		mu.Unlock()
	}, nil)
	if err != nil {
		return err
	}
	defer w.Stop(context.Background())
	published, err := b.publishPaced(b.keyPrefix("lat"), b.report.LatencyTasks, 2*time.Millisecond)
	if err != nil {
		return err
	}
	if err := b.waitDrained(time.Minute); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	lat := latencies(published, started)
	b.inProcess = lat
	r := &b.report
	r.InProcessP50Ms, r.InProcessP90Ms, r.InProcessP99Ms, r.InProcessMaxMs = pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(lat, 100)
	return nil
}

func (b *bench) latencyCrossProcess() error {
	p, err := b.spawnWorker("bench-lat", 8)
	if err != nil {
		return err
	}
	defer p.stop()
	prefix := b.keyPrefix("xlat")
	published, err := b.publishPaced(prefix, b.report.LatencyTasks, 2*time.Millisecond)
	if err != nil {
		return err
	}
	if err := b.waitDrained(time.Minute); err != nil {
		return err
	}
	// A noop handler ends as it starts: its ended_at, written in the worker
	// process, is an upper bound of its start on the same clock.
	started := map[string]time.Time{}
	for key := range published {
		t, err := b.store.Get(b.ctx, key)
		if err != nil {
			return err
		}
		if len(t.Workers) > 0 {
			started[key] = t.Workers[len(t.Workers)-1].EndedAt
		}
	}
	lat := latencies(published, started)
	b.crossProcess = lat
	r := &b.report
	r.CrossProcessP50Ms, r.CrossProcessP90Ms, r.CrossProcessP99Ms, r.CrossProcessMaxMs = pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(lat, 100)
	return nil
}

func (b *bench) prepublish(prefix string, n int, runAt time.Time) error {
	for i := range n {
		p := task.PublishParams{Key: prefix + strconv.Itoa(i), Kind: "noop"}
		p.RunAt = runAt
		if _, _, err := task.Publish(b.ctx, b.store, p); err != nil {
			return err
		}
		if i%1000 == 0 {
			b.progress("publishing %d/%d", i, n)
		}
	}
	return nil
}

func (b *bench) throughput(runs int) error {
	var inProc, cross []float64
	for run := range runs {
		n := b.report.ThroughputTasks
		if err := b.prepublish(b.keyPrefix("tput"), n, time.Time{}); err != nil {
			return err
		}
		b.progress("throughput run %d/%d in one process", run+1, runs)
		var finished atomic.Int64
		drained := make(chan struct{})
		start := time.Now()
		w, err := b.worker(b.report.Concurrency, nil, func(*consumer.Job, error) {
			if finished.Add(1) == int64(n) {
				close(drained)
			}
		})
		if err != nil {
			return err
		}
		select {
		case <-drained:
		case <-time.After(5 * time.Minute):
			err = errors.New("timed out")
		}
		elapsed := time.Since(start)
		w.Stop(context.Background())
		if err != nil {
			return err
		}
		inProc = append(inProc, float64(n)/elapsed.Seconds())

		if err := b.prepublish(b.keyPrefix("xtput"), n, time.Time{}); err != nil {
			return err
		}
		b.progress("throughput run %d/%d in a worker process", run+1, runs)
		start = time.Now()
		p, err := b.spawnWorker("bench-tput", b.report.Concurrency)
		if err != nil {
			return err
		}
		err = b.waitDrained(5 * time.Minute)
		elapsed = time.Since(start)
		b.report.WorkerPeakRSSBytes = max(b.report.WorkerPeakRSSBytes, p.rss("VmHWM"))
		p.stop()
		if err != nil {
			return err
		}
		cross = append(cross, float64(n)/elapsed.Seconds())
	}
	b.report.InProcessThroughputPerS, b.report.CrossProcessThroughputPerS = median(inProc), median(cross)
	return nil
}

func (b *bench) takeover() error {
	key := b.keyPrefix("takeover") + "0"
	if _, _, err := task.Publish(b.ctx, b.store, task.PublishParams{Key: key, Kind: "sleep", Payload: json.RawMessage(`{"duration":"1h"}`)}); err != nil {
		return err
	}
	defer task.Cancel(context.Background(), b.store, key)
	holder, err := b.spawnWorker("bench-holder", 1)
	if err != nil {
		return err
	}
	defer holder.stop()
	var doc *task.Task
	if err := b.poll(30*time.Second, func() (bool, error) {
		doc, err = b.store.Get(b.ctx, key)
		return err == nil && doc.State == task.StateRunning, err
	}); err != nil {
		return err
	}
	peer, err := b.spawnWorker("bench-peer", 1)
	if err != nil {
		return err
	}
	defer peer.stop()
	time.Sleep(time.Until(doc.Workers[0].StartedAt.Add(3 * time.Second)))
	b.report.WorkerIdleRSSBytes = peer.rss("VmRSS")
	killed := time.Now()
	holder.kill()
	if err := b.poll(time.Minute, func() (bool, error) {
		doc, err = b.store.Get(b.ctx, key)
		return err == nil && len(doc.Workers) > 1, err
	}); err != nil {
		return err
	}
	b.report.TakeoverMs = ms(doc.Workers[len(doc.Workers)-1].StartedAt.Sub(killed))
	b.report.DefaultWorkerTimeoutMs = ms(task.DefaultWorkerTimeout)
	return nil
}

func (b *bench) pendingMemory() error {
	n := b.report.PendingTasks
	if n == 0 {
		return nil
	}
	// Delayed, so the worker holds them in its bounded heap without running them.
	if err := b.prepublish(b.keyPrefix("pending"), n, time.Now().Add(time.Hour)); err != nil {
		return err
	}
	p, err := b.spawnWorker("bench-pending", b.report.Concurrency)
	if err != nil {
		return err
	}
	defer p.stop()
	time.Sleep(3 * time.Second) // let it query and settle
	b.report.WorkerRSSWithPendingBytes = p.rss("VmHWM")
	return nil
}

// worker starts an in-process consumer running noop tasks.
func (b *bench) worker(concurrency int, onStart func(*consumer.Job), onFinish func(*consumer.Job, error)) (*consumer.Consumer, error) {
	mux := consumer.NewMux()
	mux.Use(hooks(onStart, onFinish))
	mux.RegisterFunc("noop", func(context.Context, *consumer.Job) error { return nil })
	w, err := consumer.New(consumer.Config{Store: b.store, Handler: mux, Concurrency: concurrency,
		Logger:   slog.New(minLevel{slog.Default().Handler(), slog.LevelWarn}),
		WorkerID: fmt.Sprintf("bench-inproc-%d", b.round)})
	if err != nil {
		return nil, err
	}
	return w, w.Start(b.ctx)
}

type benchProc struct{ cmd *exec.Cmd }

func (b *bench) spawnWorker(id string, concurrency int) (*benchProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "--store", b.storeURL, "--log-level", "error", "worker", "--kinds", "noop,sleep",
		"--id", fmt.Sprintf("%s-%d", id, b.round), "--concurrency", strconv.Itoa(concurrency))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &benchProc{cmd: cmd}, nil
}

func (p *benchProc) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

func (p *benchProc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

// rss reads a memory figure (VmRSS, VmHWM) of the process from /proc.
func (p *benchProc) rss(field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// waitDrained waits until no task is pending or running, with the indexed
// candidate query (a state scan would compete with the worker for CPU).
func (b *bench) waitDrained(limit time.Duration) error {
	return b.poll(limit, func() (bool, error) {
		for _, ready := range []bool{true, false} {
			ts, err := b.store.Candidates(b.ctx, task.CandidateQuery{Now: b.store.Now(), Ready: ready, Limit: 1})
			if err != nil || len(ts) > 0 {
				return false, err
			}
		}
		return true, nil
	})
}

func (b *bench) poll(limit time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-b.ctx.Done():
			return b.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func latencies(published, started map[string]time.Time) []float64 {
	out := make([]float64, 0, len(published))
	for k, p := range published {
		if s, ok := started[k]; ok {
			out = append(out, ms(s.Sub(p)))
		}
	}
	slices.Sort(out)
	return out
}

func pct(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, max(0, (len(sorted)*p+99)/100-1))
	return sorted[i]
}

func median(v []float64) float64 {
	slices.Sort(v)
	return pct(v, 50)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (b *bench) print(w io.Writer) error {
	r := b.report
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "store\t%s\n", r.Store)
	fmt.Fprintf(tw, "publish-to-start, one process (%d tasks, 2 ms apart)\tp50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n", r.LatencyTasks, r.InProcessP50Ms, r.InProcessP90Ms, r.InProcessP99Ms, r.InProcessMaxMs)
	fmt.Fprintf(tw, "publish-to-start, across processes\tp50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n", r.CrossProcessP50Ms, r.CrossProcessP90Ms, r.CrossProcessP99Ms, r.CrossProcessMaxMs)
	fmt.Fprintf(tw, "noop throughput, concurrency %d (%d tasks, median)\tone process %.0f/s  worker process %.0f/s\n", r.Concurrency, r.ThroughputTasks, r.InProcessThroughputPerS, r.CrossProcessThroughputPerS)
	fmt.Fprintf(tw, "takeover after SIGKILL (default lease %.0f ms)\t%.0f ms\n", r.DefaultWorkerTimeoutMs, r.TakeoverMs)
	fmt.Fprintf(tw, "worker RSS\tidle %.1f MiB  peak in throughput run %.1f MiB  with %d pending %.1f MiB\n",
		mib(r.WorkerIdleRSSBytes), mib(r.WorkerPeakRSSBytes), r.PendingTasks, mib(r.WorkerRSSWithPendingBytes))
	return tw.Flush()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// hooks is middleware calling onStart and onFinish (each may be nil)
// around every handler run.
func hooks(onStart func(*consumer.Job), onFinish func(*consumer.Job, error)) consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			if onStart != nil {
				onStart(job)
			}
			err := next.Handle(ctx, job)
			if onFinish != nil {
				onFinish(job, err)
			}
			return err
		})
	}
}
