package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leasepool/leasepool/internal/bench"
)

// peer is one queue system under test, as seen by the producer process.
type peer interface {
	// Publish enqueues one job of kind "noop" or "sleep" and returns its id.
	Publish(ctx context.Context, kind string) (string, error)
	// PublishMany enqueues n noop jobs, to run at runAt (zero: now).
	PublishMany(ctx context.Context, n int, runAt time.Time) error
	// Busy tells whether any job is still waiting or running.
	Busy(ctx context.Context) (bool, error)
	// Reset removes every job left (the takeover job, delayed jobs).
	Reset(ctx context.Context) error
	// Versions names the client libraries and the server with their versions.
	Versions(ctx context.Context) map[string]string
	Close()
}

// report mirrors the field names of `leasepool bench --json` for the
// figures measured the same way; every name carries its unit.
type report struct {
	System          string            `json:"system"`
	Store           string            `json:"store"`
	Versions        map[string]string `json:"versions"`
	SettingsChanged []string          `json:"settings_changed"`
	LatencyTasks    int               `json:"latency_tasks"`
	bench.CrossProcessLatency
	ThroughputTasks int       `json:"throughput_tasks"`
	Concurrency     int       `json:"concurrency"`
	ThroughputRuns  []float64 `json:"throughput_runs_per_s"`
	ThroughputPerS  float64   `json:"throughput_worker_process_per_s"`
	TakeoverMs      *float64  `json:"takeover_after_sigkill_ms"` // null: not within the cap
	TakeoverCapMs   float64   `json:"takeover_cap_ms"`
	TakeoverNote    string    `json:"takeover_note,omitempty"`
	LatencyNote     string    `json:"latency_note,omitempty"`
	PeakRSSBytes    int64     `json:"worker_peak_rss_throughput_bytes"`
	IdleRSSBytes    int64     `json:"worker_rss_idle_bytes"`
	PendingTasks    int       `json:"pending_tasks"`
	RSSPendingBytes int64     `json:"worker_rss_with_pending_bytes"`
}

type harness struct {
	ctx      context.Context
	p        peer
	system   string // river or asynq
	name     string // system, or system-tuned: the report's and files' name
	tuned    bool
	url      string
	dir      string // output: samples, worker logs, record files
	r        report
	runs     int
	cap      time.Duration
	round    int
	settings []string
	// throughputOnly runs the throughput step alone.
	throughputOnly bool
}

func (h *harness) progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", h.name, fmt.Sprintf(format, args...))
}

func (h *harness) run() error {
	h.r.Versions = h.p.Versions(h.ctx)
	h.r.SettingsChanged = h.settings
	steps := []struct {
		name string
		fn   func() error
	}{
		{"latency across processes", h.latency},
		{"throughput", h.throughput},
		{"takeover", h.takeover},
		{"memory with pending jobs", h.pendingMemory},
	}
	if h.throughputOnly {
		steps = steps[1:2] // throughput
	}
	for _, s := range steps {
		h.progress("%s...", s.name)
		if err := s.fn(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// worker is a worker process of the system under test, started from this
// same executable.
type worker struct {
	*bench.Process
	record string
}

// spawnWorker starts a worker process; record: it writes job start times.
func (h *harness) spawnWorker(name string, concurrency int, record bool) (*worker, error) {
	h.round++
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rec := filepath.Join(h.dir, fmt.Sprintf("%s-%d-%s.rec", h.name, h.round, name))
	os.Remove(rec)
	logf, err := os.Create(filepath.Join(h.dir, fmt.Sprintf("%s-%d-%s.log", h.name, h.round, name)))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	recArg := ""
	if record {
		recArg = rec
	}
	cmd := exec.Command(exe, "worker", "-system", h.system, "-url", h.url,
		"-concurrency", strconv.Itoa(concurrency), "-record", recArg, "-tuned="+strconv.FormatBool(h.tuned))
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := bench.Start(cmd)
	if err != nil {
		return nil, err
	}
	return &worker{Process: p, record: rec}, nil
}

// waitReady waits for the worker's "ready" line: its client is started.
func (w *worker) waitReady(ctx context.Context) error {
	return poll(ctx, 30*time.Second, func() (bool, error) {
		if w.Cmd.ProcessState != nil {
			return false, errors.New("worker exited")
		}
		_, ready := readRecord(w.record)
		return ready, nil
	})
}

// readRecord reads a worker's record file: one "ID UNIXNANO" line per job
// start, written by the worker when the handler starts, plus "ready UNIXNANO".
func readRecord(path string) (map[string]time.Time, bool) {
	data, _ := os.ReadFile(path)
	starts := map[string]time.Time{}
	ready := false
	for line := range strings.Lines(string(data)) {
		id, ns, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue // a line being written
		}
		n, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			continue
		}
		if id == "ready" {
			ready = true
			continue
		}
		if _, seen := starts[id]; !seen {
			starts[id] = time.Unix(0, n)
		}
	}
	return starts, ready
}

func (h *harness) latency() error {
	w, err := h.spawnWorker("latency", 8, true)
	if err != nil {
		return err
	}
	defer w.Stop()
	if err := w.waitReady(h.ctx); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond) // idle
	n := h.r.LatencyTasks
	published := make(map[string]time.Time, n)
	next := time.Now()
	gap := 2 * time.Millisecond
	for range n {
		id, err := h.p.Publish(h.ctx, "noop")
		if err != nil {
			return err
		}
		published[id] = time.Now()
		next = next.Add(gap)
		time.Sleep(time.Until(next))
	}
	var started map[string]time.Time
	if err := poll(h.ctx, time.Minute, func() (bool, error) {
		started, _ = readRecord(w.record)
		return len(started) >= n, nil
	}); err != nil {
		return fmt.Errorf("%d of %d jobs started: %w", len(started), n, err)
	}
	lat := bench.Latencies(published, started)
	h.r.CrossProcessLatency = bench.CrossProcess(lat)
	return writeJSON(filepath.Join(h.dir, h.name+".samples.json"), lat)
}

func (h *harness) throughput() error {
	var runs []float64
	for run := range h.runs {
		n := h.r.ThroughputTasks
		h.progress("throughput run %d/%d: publishing %d", run+1, h.runs, n)
		if err := h.p.PublishMany(h.ctx, n, time.Time{}); err != nil {
			return err
		}
		h.progress("throughput run %d/%d: draining", run+1, h.runs)
		start := time.Now()
		w, err := h.spawnWorker("throughput", h.r.Concurrency, false)
		if err != nil {
			return err
		}
		err = poll(h.ctx, 5*time.Minute, func() (bool, error) {
			busy, err := h.p.Busy(h.ctx)
			return !busy, err
		})
		elapsed := time.Since(start)
		h.r.PeakRSSBytes = max(h.r.PeakRSSBytes, w.RSS("VmHWM"))
		w.Stop()
		if err != nil {
			return err
		}
		runs = append(runs, float64(n)/elapsed.Seconds())
	}
	h.r.ThroughputRuns = slices.Clone(runs)
	h.r.ThroughputPerS = bench.Median(runs)
	return nil
}

func (h *harness) takeover() error {
	defer h.p.Reset(context.Background())
	id, err := h.p.Publish(h.ctx, "sleep")
	if err != nil {
		return err
	}
	holder, err := h.spawnWorker("holder", 1, true)
	if err != nil {
		return err
	}
	defer holder.Stop()
	var startedAt time.Time
	if err := poll(h.ctx, 30*time.Second, func() (bool, error) {
		s, _ := readRecord(holder.record)
		startedAt = s[id]
		return !startedAt.IsZero(), nil
	}); err != nil {
		return fmt.Errorf("holder never started the job: %w", err)
	}
	peer, err := h.spawnWorker("peer", 1, true)
	if err != nil {
		return err
	}
	defer peer.Kill() // its job sleeps for an hour
	time.Sleep(time.Until(startedAt.Add(3 * time.Second)))
	h.r.IdleRSSBytes = peer.RSS("VmRSS")
	killed := time.Now()
	holder.Kill()
	h.r.TakeoverCapMs = bench.Ms(h.cap)
	h.progress("takeover: holder killed; waiting up to %s for the peer", h.cap)
	var took time.Time
	err = poll(h.ctx, h.cap, func() (bool, error) {
		s, _ := readRecord(peer.record)
		took = s[id]
		return !took.IsZero(), nil
	})
	if err == nil {
		v := bench.Ms(took.Sub(killed))
		h.r.TakeoverMs = &v
	}
	return nil
}

func (h *harness) pendingMemory() error {
	n := h.r.PendingTasks
	if n == 0 {
		return nil
	}
	// Delayed an hour, so the worker holds them without running them.
	h.progress("publishing %d delayed jobs", n)
	if err := h.p.PublishMany(h.ctx, n, time.Now().Add(time.Hour)); err != nil {
		return err
	}
	defer h.p.Reset(context.Background())
	w, err := h.spawnWorker("pending", h.r.Concurrency, false)
	if err != nil {
		return err
	}
	defer w.Stop()
	time.Sleep(3 * time.Second) // let it query and settle
	h.r.RSSPendingBytes = w.RSS("VmHWM")
	return nil
}

// poll is bench.Poll every 5 ms, more often than leasepool bench's 20:
// the throughput figure ends when the producer sees the queue drained.
func poll(ctx context.Context, limit time.Duration, done func() (bool, error)) error {
	return bench.Poll(ctx, limit, 5*time.Millisecond, done)
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// recorder appends "ID UNIXNANO" lines, one write each, so a reader in
// another process sees whole lines as they happen.
type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func newRecorder(path string) (*recorder, error) {
	if path == "" {
		return &recorder{}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f}, nil
}

func (r *recorder) mark(id string) {
	if r.f == nil {
		return
	}
	line := id + " " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n"
	r.mu.Lock()
	r.f.WriteString(line)
	r.mu.Unlock()
}
