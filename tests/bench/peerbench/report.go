package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/internal/bench"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// result is one system's figures: a peerbench report, or the output of
// `leasepool bench --json` (which has no system, versions or samples).
type result struct {
	report
	DefaultWorkerTimeoutMs float64 `json:"default_worker_timeout_ms"` // leasepool's
	name                   string
	samples                []float64
	interleaved            int // throughput runs from tests/bench/run's interleaved rounds
}

func reportMain(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	dir := fs.String("dir", ".", "directory with SYSTEM.json and SYSTEM.samples.json files")
	md := fs.String("md", "results.md", "markdown file to write")
	png := fs.String("png", "latency-cdf.png", "latency CDF plot to write")
	command := fs.String("command", "tests/bench/run", "the command that reproduces the table")
	leasepoolRev := fs.String("leasepool-rev", "", "leasepool's commit")
	mode := fs.String("mode", "full", "full or quick")
	fs.Parse(args)

	results, err := loadResults(*dir, *leasepoolRev)
	if err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("no results in %s", *dir)
	}
	var plotted []string
	if err := plotCDF(results, *png, &plotted); err != nil {
		return err
	}
	text := markdown(results, *command, *mode, filepath.Base(*png), plotted)
	fmt.Print(table(results))
	return os.WriteFile(*md, []byte(text), 0o644)
}

func loadResults(dir, leasepoolRev string) ([]result, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []result
	for _, f := range files {
		if strings.HasSuffix(f, ".samples.json") || filepath.Base(f) == "curve.json" { // curve.json: tests/bench/curve's points, no system's row
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r result
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		r.name = strings.TrimSuffix(filepath.Base(f), ".json")
		if r.System == "" { // leasepool bench --json
			r.System = r.name
			r.Versions = map[string]string{"leasepool": leasepoolRev, "go": runtime.Version()}
			if r.ThroughputRuns == nil {
				r.ThroughputRuns = []float64{}
			}
		}
		if data, err := os.ReadFile(strings.TrimSuffix(f, ".json") + ".samples.json"); err == nil {
			// peers: an array; leasepool bench --samples: {"in_process": [...], "cross_process": [...]}
			if json.Unmarshal(data, &r.samples) != nil {
				var lp struct {
					CrossProcess []float64 `json:"cross_process"`
				}
				json.Unmarshal(data, &lp)
				r.samples = lp.CrossProcess
			}
		}
		if err := addRounds(dir, &r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	// leasepool first, then the peers by name.
	slices.SortFunc(out, func(a, b result) int {
		la, lb := strings.HasPrefix(a.System, "leasepool"), strings.HasPrefix(b.System, "leasepool")
		if la != lb {
			if la {
				return -1
			}
			return 1
		}
		return strings.Compare(a.System, b.System)
	})
	return out, nil
}

// addRounds adds to r the throughput runs of tests/bench/run's
// interleaved rounds (rounds/*/NAME.json, each from a throughput-only
// run) and makes r's throughput the median of all its runs.
func addRounds(dir string, r *result) error {
	files, err := filepath.Glob(filepath.Join(dir, "rounds", "*", r.name+".json"))
	if err != nil || len(files) == 0 {
		return err
	}
	slices.Sort(files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var round result
		if err := json.Unmarshal(data, &round); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		r.ThroughputRuns = append(r.ThroughputRuns, round.ThroughputRuns...)
		r.interleaved += len(round.ThroughputRuns)
	}
	r.ThroughputPerS = bench.Median(slices.Clone(r.ThroughputRuns))
	return nil
}

func mib(b int64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func msf(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func takeover(r result) string {
	if r.TakeoverMs != nil {
		return fmt.Sprintf("%.1f s", *r.TakeoverMs/1000)
	}
	return fmt.Sprintf("> %.0f s (not within the cap)", r.TakeoverCapMs/1000)
}

func table(results []result) string {
	var b strings.Builder
	pending := 0
	for _, r := range results {
		pending = max(pending, r.PendingTasks)
	}
	fmt.Fprintf(&b, "| system | store | publish→start p50 | p99 | max | throughput, 1 worker process | takeover after SIGKILL | worker RSS idle | peak (throughput) | with %d pending |\n", pending)
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s ms | %s ms | %s ms | %.0f jobs/s | %s | %s | %s | %s |\n",
			r.System, storeName(r), msf(r.CrossProcessP50Ms), msf(r.CrossProcessP99Ms), msf(r.CrossProcessMaxMs),
			r.ThroughputPerS, takeover(r), mib(r.IdleRSSBytes), mib(r.PeakRSSBytes), pendingRSS(r))
	}
	return b.String()
}

func storeName(r result) string {
	s := r.Store
	switch {
	case strings.HasPrefix(s, "sqlite:"):
		return "embedded (SQLite file)"
	case strings.HasPrefix(s, "mongodb:"):
		return "MongoDB wire test server"
	}
	return s
}

func pendingRSS(r result) string {
	if r.PendingTasks == 0 {
		return "skipped"
	}
	return mib(r.RSSPendingBytes) + fmt.Sprintf(" (%d)", r.PendingTasks)
}

func markdown(results []result, command, mode, png string, plotted []string) string {
	var b strings.Builder
	b.WriteString("# leasepool and its peers, one machine, one method\n\n")
	if mode == "quick" {
		b.WriteString("**Quick run** (`--quick`: fewer throughput jobs, one run, fewer pending jobs): for development, not for comparison.\n\n")
	}
	fmt.Fprintf(&b, "Reproduce (from the repository root, as root on Debian):\n\n```\n%s\n```\n\n", command)
	b.WriteString(table(results))
	b.WriteString("\n")
	fmt.Fprintf(&b, "![publish-to-start latency CDF](%s)\n\n", png)
	fmt.Fprintf(&b, "Latency CDF plotted for: %s.", strings.Join(plotted, ", "))
	b.WriteString(" Latencies at or below 0.01 ms (a job can start before its publish call has returned to the producer) are drawn at 0.01 ms; the percentiles use the raw values.")
	var missing []string
	for _, r := range results {
		if len(r.samples) == 0 {
			missing = append(missing, r.System)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(&b, " Not plotted (no raw samples): %s.", strings.Join(missing, ", "))
	}
	b.WriteString("\n\n## Method\n\n")
	b.WriteString(`The same for every system; the peers' harness (tests/bench/peerbench, tests/bench/bullmq) mirrors package internal/bench (leasepool bench) and uses its statistics.
Producer and workers are separate processes on this host; start times are taken in the worker's handler and compared with the producer's on the same host clock.

- **publish→start**: ` + "`latency_tasks`" + ` jobs published one at a time, 2 ms apart, to an idle worker process at concurrency 8; from just after the publish call returns to the handler's start. Nearest-rank percentiles.
  Publishing begins once the worker process is ready: the peers' worker reports it (its client started), leasepool's has registered in the store's worker registry (its consumer started).
  leasepool bench takes a noop task's ended_at as its start (an upper bound); the peers record the handler's first instruction.
- **throughput**: noop jobs pre-published, then one worker process at concurrency 32 drains them; from spawning the worker to the producer seeing no job waiting or running (polled every 5 ms). Median of all of a system's runs: those of its own pass and, with --rounds N (default 4), one more in each of N interleaved rounds, each round running every system once in an order rotated round by round, so that a slow spell of this machine falls on every system alike (River with its defaults sits the rounds out: its FetchCooldown bounds it). The per-system table lists the runs in order.
- **takeover**: a worker (concurrency 1) holding a long job is SIGKILLed 3 s after the job started; time until a second, already running worker starts it. Default settings, so this is each system's default failure detection. The wait is capped; "> cap" means it did not happen in time.
- **servers**: PostgreSQL with initdb's defaults and Redis with its compiled-in defaults (no config file), private instances started by tests/bench/run; only port, listen address and directories set. Peer libraries with their defaults; a worker sets only its concurrency. leasepool: ` + "`leasepool bench`" + `'s defaults (embedded store: a temporary SQLite file).
- **RSS**: worker idle = VmRSS of that second worker, idle, 3 s in; peak = VmHWM of the throughput worker; with pending = VmHWM of a worker at concurrency 32 given 3 s with that many jobs delayed an hour.
`)
	b.WriteString("\n## Per system\n\n| system | throughput runs (jobs/s) | latency p90 | defaults behind the latency | takeover default | settings changed | versions |\n|---|---|---:|---|---|---|---|\n")
	for _, r := range results {
		var runs []string
		own := len(r.ThroughputRuns) - r.interleaved
		for i, v := range r.ThroughputRuns {
			sep := ""
			if i == own && i > 0 {
				sep = "interleaved: "
			}
			runs = append(runs, fmt.Sprintf("%s%.0f", sep, v))
		}
		if len(runs) == 0 {
			runs = []string{fmt.Sprintf("median %.0f", r.ThroughputPerS)}
		}
		note := r.TakeoverNote
		if strings.HasPrefix(r.System, "leasepool") && r.DefaultWorkerTimeoutMs > 0 {
			note = fmt.Sprintf("default worker timeout %.0f ms", r.DefaultWorkerTimeoutMs)
		}
		settings := "none"
		if len(r.SettingsChanged) > 0 {
			settings = strings.Join(r.SettingsChanged, "; ")
		}
		var vs []string
		for _, k := range slices.Sorted(mapsKeys(r.Versions)) {
			vs = append(vs, fmt.Sprintf("%s %s", k, r.Versions[k]))
		}
		lnote := r.LatencyNote
		if lnote == "" {
			lnote = "–"
		}
		fmt.Fprintf(&b, "| %s | %s (%d jobs each) | %s ms | %s | %s | %s | %s |\n", r.System, strings.Join(runs, ", "), r.ThroughputTasks,
			msf(r.CrossProcessP90Ms), lnote, note, settings, strings.Join(vs, ", "))
	}
	b.WriteString("\n## Machine\n\n")
	b.WriteString(machine())
	return b.String()
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func machine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "- date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- nproc: %d\n", runtime.NumCPU())
	fmt.Fprintf(&b, "- CPU: %s\n", firstField("/proc/cpuinfo", "model name"))
	fmt.Fprintf(&b, "- memory: %s\n", firstField("/proc/meminfo", "MemTotal"))
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		fmt.Fprintf(&b, "- kernel: Linux %s\n", strings.TrimSpace(string(k)))
	}
	fmt.Fprintf(&b, "- OS: %s\n", strings.Trim(firstField("/etc/os-release", "PRETTY_NAME="), `"`))
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "- load average when the report was written (1, 5, 15 min): %s\n", strings.Join(strings.Fields(string(l))[:3], " "))
	}
	b.WriteString("- the machine was not reserved: other processes (e.g. test servers, builds) may have run meanwhile\n")
	return b.String()
}

// firstField returns what follows "key:" (or "key=") on the first matching line.
func firstField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			return strings.TrimSpace(strings.TrimLeft(rest, " \t:"))
		}
	}
	return "?"
}

var palette = []color.Color{
	color.RGBA{31, 119, 180, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{44, 160, 44, 255},
	color.RGBA{214, 39, 40, 255}, color.RGBA{148, 103, 189, 255}, color.RGBA{140, 86, 75, 255},
}

func plotCDF(results []result, path string, plotted *[]string) error {
	p := plot.New()
	p.Title.Text = "publish-to-start latency, cross-process (2 ms apart, concurrency 8)"
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of jobs started"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.YOffs = -vg.Points(8)
	p.X.Min = 0.01
	i := 0
	for _, r := range results {
		if len(r.samples) == 0 {
			continue
		}
		s := slices.Clone(r.samples)
		slices.Sort(s)
		pts := make(plotter.XYs, len(s))
		for j, v := range s {
			pts[j].X = math.Max(v, 0.01) // log scale: ≤ 0.01 ms (started before publish returned) drawn at 0.01
			pts[j].Y = float64(j+1) / float64(len(s))
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (p50 %s ms)", r.System, msf(r.CrossProcessP50Ms)), l)
		*plotted = append(*plotted, r.System)
		i++
	}
	if i == 0 {
		return nil
	}
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}
