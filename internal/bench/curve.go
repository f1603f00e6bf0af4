package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Defaults of CurveConfig's zero values.
var (
	DefaultCurveBacklogs = []int{10000, 100000, 1000000}
	DefaultCurveWorkers  = []int{1, 2, 4}
)

const (
	DefaultCurveDrain    = 20000
	DefaultCurveFinished = 1000000
	// probeGap paces the probes published during a drain.
	probeGap = 20 * time.Millisecond
	// probePriority puts probes ahead of the backlog, as a new urgent task
	// would be: their latency is the claim latency under that backlog.
	probePriority = 10
)

// CurveConfig says which points of the cost curve to measure: how a
// worker's throughput, claim latency and memory change with the number of
// pending tasks, finished tasks and worker processes on one embedded store.
type CurveConfig struct {
	// Dir holds the stores, one per backlog, made and removed here.
	// Required.
	Dir string
	// OpenStore opens a store URL (see package store). Required.
	OpenStore func(ctx context.Context, url string) (task.Store, error)
	// WorkerCommand starts worker processes, as in Config. Required.
	WorkerCommand func(storeURL, id string, concurrency int) *exec.Cmd
	// Backlogs are the pending task counts measured. Default
	// DefaultCurveBacklogs.
	Backlogs []int
	// Finished adds a point of the smallest backlog in a store that also
	// holds this many finished tasks; 0 means DefaultCurveFinished, -1 none.
	Finished int
	// Workers are the worker process counts measured at each backlog.
	// Default DefaultCurveWorkers.
	Workers []int
	// Concurrency of each worker process. Default DefaultConcurrency.
	Concurrency int
	// Drain is the most tasks drained per point (at most half the
	// backlog, so the backlog stays within a factor of two of its
	// nominal size). Default DefaultCurveDrain.
	Drain int
	// Progress receives one-line progress, each overwriting the last.
	Progress io.Writer
}

// CurvePoint is one measured point of the cost curve.
type CurvePoint struct {
	Pending        int     `json:"pending"`
	Finished       int     `json:"finished"`
	Workers        int     `json:"workers"`
	Drained        int     `json:"drained"`
	ThroughputPerS float64 `json:"throughput_per_s"`
	// Claim latency: publish to start of probes published every 20 ms at
	// a higher priority than the backlog while it drains, in ms.
	Probes     int     `json:"probes"`
	ClaimP50Ms float64 `json:"claim_p50_ms"`
	ClaimP99Ms float64 `json:"claim_p99_ms"`
	ClaimMaxMs float64 `json:"claim_max_ms"`
	// WorkerRSSBytes is the largest peak RSS (VmHWM) of the point's workers.
	WorkerRSSBytes int64 `json:"worker_peak_rss_bytes"`
}

func (c *CurveConfig) withDefaults() (CurveConfig, error) {
	d := *c
	if d.Dir == "" || d.OpenStore == nil || d.WorkerCommand == nil {
		return d, fmt.Errorf("%w: bench curve: Dir, OpenStore and WorkerCommand are required", task.ErrInvalid)
	}
	if len(d.Backlogs) == 0 {
		d.Backlogs = DefaultCurveBacklogs
	}
	if len(d.Workers) == 0 {
		d.Workers = DefaultCurveWorkers
	}
	for _, f := range []struct {
		name string
		v    []int
		min  int
	}{{"Backlogs", d.Backlogs, 2}, {"Workers", d.Workers, 1}} {
		for _, v := range f.v {
			if v < f.min {
				return d, fmt.Errorf("%w: bench curve: %s must be at least %d, got %d", task.ErrInvalid, f.name, f.min, v)
			}
		}
	}
	if d.Finished < -1 || d.Concurrency < 0 || d.Drain < 0 {
		return d, fmt.Errorf("%w: bench curve: Finished, Concurrency and Drain must not be negative", task.ErrInvalid)
	}
	if d.Finished == 0 {
		d.Finished = DefaultCurveFinished
	}
	if d.Concurrency == 0 {
		d.Concurrency = DefaultConcurrency
	}
	if d.Drain == 0 {
		d.Drain = DefaultCurveDrain
	}
	if d.Progress == nil {
		d.Progress = io.Discard
	}
	return d, nil
}

// Curve measures the cost curve: for each backlog, a fresh store holding
// that many pending noop tasks (plus, for the finished point, finished
// ones), drained by each number of worker processes in turn, the backlog
// topped up between points. It takes minutes with the defaults, most of
// them publishing the million-task stores.
func Curve(ctx context.Context, cfg CurveConfig) ([]CurvePoint, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	type storeSpec struct{ pending, finished int }
	specs := make([]storeSpec, 0, len(c.Backlogs)+1)
	for _, b := range c.Backlogs {
		specs = append(specs, storeSpec{pending: b})
	}
	if c.Finished > 0 {
		specs = append(specs, storeSpec{pending: c.Backlogs[0], finished: c.Finished})
	}
	var out []CurvePoint
	for i, spec := range specs {
		cs := &curveStore{cfg: c, pending: spec.pending, finished: spec.finished,
			url: "sqlite:" + filepath.Join(c.Dir, fmt.Sprintf("curve-%d.db", i))}
		points, err := cs.measure(ctx)
		if err != nil {
			return nil, fmt.Errorf("bench curve, %d pending, %d finished: %w", spec.pending, spec.finished, err)
		}
		out = append(out, points...)
	}
	fmt.Fprint(c.Progress, "\r\033[Kdone\n")
	return out, nil
}

// curveStore is one store of the curve and the points measured on it.
type curveStore struct {
	cfg               CurveConfig
	url               string
	st                task.Store
	pending, finished int
	published         int // backlog tasks published: keys b-0 ... b-(published-1)
	drained           int // of them, the ones drained by earlier points
	probes            int
}

func (cs *curveStore) progress(format string, args ...any) {
	fmt.Fprintf(cs.cfg.Progress, "\r\033[K%d pending, %d finished: "+format, append([]any{cs.pending, cs.finished}, args...)...)
}

func (cs *curveStore) measure(ctx context.Context) ([]CurvePoint, error) {
	st, err := cs.cfg.OpenStore(ctx, cs.url)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	cs.st = st
	if err := cs.fill(ctx, "f-", cs.finished, true); err != nil {
		return nil, err
	}
	var out []CurvePoint
	for _, w := range cs.cfg.Workers {
		// Top up to the nominal backlog: drained tasks are replaced by new
		// ones at the back of the line.
		if err := cs.fill(ctx, "b-", cs.pending-(cs.published-cs.drained), false); err != nil {
			return nil, err
		}
		p, err := cs.point(ctx, w)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// fill publishes n noop tasks keyed prefix+number, many at once, so that
// the store's group commit batches them; finished ones are stored
// cancelled.
func (cs *curveStore) fill(ctx context.Context, prefix string, n int, finished bool) error {
	first := 0
	if prefix == "b-" {
		first = cs.published
		cs.published += n
	}
	var next, done atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range 128 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n) && ctx.Err() == nil; i = next.Add(1) - 1 {
				if err := cs.insert(ctx, prefix+strconv.Itoa(first+int(i)), finished); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				if d := done.Add(1); d%10000 == 0 {
					cs.progress("publishing %d/%d", d, n)
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func (cs *curveStore) insert(ctx context.Context, key string, finished bool) error {
	p := task.PublishParams{Key: key, Kind: "noop"}
	if !finished {
		_, _, err := task.Publish(ctx, cs.st, p)
		return err
	}
	t, err := task.NewTask(p, cs.st.Now())
	if err != nil {
		return err
	}
	if err := t.Cancel(cs.st.Now()); err != nil {
		return err
	}
	_, _, err = cs.st.Insert(ctx, t)
	return err
}

// point drains up to Drain backlog tasks with w worker processes. The
// backlog drains in publish order, so the drain is timed by polling two
// marker tasks: from the tenth of the drain (the workers are up and
// running) to its end.
func (cs *curveStore) point(ctx context.Context, w int) (CurvePoint, error) {
	p := CurvePoint{Pending: cs.pending, Finished: cs.finished, Workers: w, Drained: min(cs.cfg.Drain, cs.pending/2)}
	from, to := cs.drained+p.Drained/10, cs.drained+p.Drained-1
	procs := make([]*Process, 0, w)
	defer func() {
		for _, pr := range procs {
			pr.Stop()
		}
	}()
	for i := range w {
		pr, err := Start(cs.cfg.WorkerCommand(cs.url, fmt.Sprintf("curve-%d-%d", w, i), cs.cfg.Concurrency))
		if err != nil {
			return p, err
		}
		procs = append(procs, pr)
	}
	probeCtx, stopProbes := context.WithCancel(ctx)
	probed := make(chan map[string]time.Time, 1)
	go func() { probed <- cs.probe(probeCtx) }()
	cs.progress("%d workers draining %d", w, p.Drained)
	start, err := cs.finishedAt(ctx, "b-"+strconv.Itoa(from))
	var end time.Time
	if err == nil {
		end, err = cs.finishedAt(ctx, "b-"+strconv.Itoa(to))
	}
	stopProbes()
	published := <-probed
	if err != nil {
		return p, err
	}
	cs.drained += p.Drained
	p.ThroughputPerS = float64(to-from) / end.Sub(start).Seconds()
	for _, pr := range procs {
		p.WorkerRSSBytes = max(p.WorkerRSSBytes, pr.RSS("VmHWM"))
	}
	lat, err := cs.probeLatencies(ctx, published)
	if err != nil {
		return p, err
	}
	s := Summarize(lat)
	p.Probes, p.ClaimP50Ms, p.ClaimP99Ms, p.ClaimMaxMs = len(lat), s.P50, s.P99, s.Max
	return p, nil
}

// finishedAt polls key until it has finished and returns when it ended.
func (cs *curveStore) finishedAt(ctx context.Context, key string) (time.Time, error) {
	var at time.Time
	err := Poll(ctx, 10*time.Minute, 5*time.Millisecond, func() (bool, error) {
		t, err := cs.st.Get(ctx, key)
		if err != nil || !t.State.Finished() || len(t.Attempts) == 0 {
			return false, err
		}
		at = t.Attempts[len(t.Attempts)-1].EndedAt
		return true, nil
	})
	return at, err
}

// probe publishes a noop task every probeGap until ctx ends and returns
// when each was published.
func (cs *curveStore) probe(ctx context.Context) map[string]time.Time {
	published := map[string]time.Time{}
	tick := time.NewTicker(probeGap)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return published
		case <-tick.C:
		}
		key := "probe-" + strconv.Itoa(cs.probes)
		cs.probes++
		if _, _, err := task.Publish(ctx, cs.st, task.PublishParams{Key: key, Kind: "noop", Options: task.Options{Priority: probePriority}}); err == nil {
			published[key] = cs.st.Now() // the workers stamp starts with the store's clock
		}
	}
}

// probeLatencies waits for the probes to finish (the workers are still
// up) and returns their publish-to-start latencies, sorted. A noop ends as
// it starts: its end, stamped by the worker, bounds its start from above.
func (cs *curveStore) probeLatencies(ctx context.Context, published map[string]time.Time) ([]float64, error) {
	started := make(map[string]time.Time, len(published))
	for key := range published {
		at, err := cs.finishedAt(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("probe %s: %w", key, err)
		}
		started[key] = at
	}
	return Latencies(published, started), nil
}

// PrintCurve writes points as the table `leasepool bench curve` prints.
func PrintCurve(w io.Writer, points []CurvePoint) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pending\tfinished\tworkers\tdrained\ttasks/s\tclaim p50 ms\tclaim p99 ms\tclaim max ms\tworker peak RSS MiB\t")
	for _, p := range points {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.1f\t\n", p.Pending, p.Finished, p.Workers, p.Drained,
			p.ThroughputPerS, p.ClaimP50Ms, p.ClaimP99Ms, p.ClaimMaxMs, mib(p.WorkerRSSBytes))
	}
	return tw.Flush()
}
