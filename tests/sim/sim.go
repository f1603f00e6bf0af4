// Package sim runs many consumers in one process against an in-memory
// store (task/memstore) and measures what each task costs: store writes,
// claim conflicts, change events delivered to each worker, publish-to-start
// and takeover times. It checks the queue's invariants on every run: one
// live holder per task, nothing lost, pins and lock lines honoured.
//
// Run must be called inside a testing/synctest bubble: every wait (store
// latency, leases, pings, heartbeats) is then virtual, so a thousand
// workers and minutes of leases cost seconds of CPU, and a run is
// independent of the machine's load. CPU work takes no virtual time: what
// the figures show is the protocol's cost, not a machine's speed.
package sim

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// Config is one simulated run.
type Config struct {
	Workers     int
	Concurrency int // handlers per worker; default 4
	Tasks       int
	// PublishEvery is the gap between publishes; 0 publishes every task
	// before the workers start (a backlog to drain).
	PublishEvery time.Duration
	// Work is how long each handler runs; default 10ms.
	Work time.Duration
	// Latency is the mean time a store call takes (each call jittered
	// uniformly in [0.5, 1.5) of it); default 1ms.
	Latency time.Duration
	// Kill cuts this many workers off the store (as a crash would) at
	// random times while tasks are published; their tasks are taken over.
	Kill int
	// PinEvery pins every n-th task to two workers (0: none); LockEvery
	// gives every n-th task one of LockKeys lock keys, with a random
	// priority of 0 to 2 (0: none).
	PinEvery, LockEvery, LockKeys int
	// FaultRate fails this fraction of updates, half of them after they
	// applied (the caller cannot tell).
	FaultRate float64
	Seed      uint64
	// Timeout bounds the run in virtual time; default 10 minutes.
	Timeout time.Duration
}

func (c *Config) defaults() {
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Work == 0 {
		c.Work = 10 * time.Millisecond
	}
	if c.Latency == 0 {
		c.Latency = time.Millisecond
	}
	if c.LockKeys == 0 {
		c.LockKeys = 4
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
}

// lanes is how many delivery schedules the workers' change streams share
// (memstore.Config.Lanes): up to 16 workers each hear a change at a moment
// of their own; a thousand hear it at 16 moments, spread by the same
// latency, so that one write costs 16 timers rather than a thousand.
const lanes = 16

// Result is what one run measured, per task where it says so.
type Result struct {
	Config Config
	// Writes is task documents written per task (publish, claims,
	// renewals, outcomes); Conflicts is claim tries that met a newer
	// version (consumer.Observer.ClaimConflict) per task.
	Writes, Conflicts float64
	// Events is change events delivered to each worker per task; Reads
	// is task reads (Get, candidate pages) by every worker per task, and
	// Rows the tasks those candidate pages held, per task.
	Events, Reads, Rows float64
	// StartP50, StartP99: publish to first start.
	StartP50, StartP99 time.Duration
	// Takeovers counts claims that replaced an expired lease; TakeoverMax
	// is the longest from such a lease's end to the claim.
	Takeovers   int
	TakeoverMax time.Duration
	// Elapsed is the run's virtual time, from the first publish to the
	// last finish; Wall is the real time the run took, set by the caller
	// (outside the bubble, where the clock is real).
	Elapsed, Wall time.Duration
	Violations    []string
}

// Header and Row print results as a Markdown table.
const Header = "| W | tasks | writes/task | conflicts/task | events/task/worker | reads/task | rows/task | start p50 | start p99 | takeovers | takeover max | violations | virtual time | wall time |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// Row is r as one line of the table under Header.
func (r Result) Row() string {
	return fmt.Sprintf("| %d | %d | %.2f | %.3f | %.2f | %.2f | %.2f | %s | %s | %d | %s | %d | %s | %s |", r.Config.Workers, r.Config.Tasks,
		r.Writes, r.Conflicts, r.Events, r.Reads, r.Rows, r.StartP50.Round(time.Millisecond), r.StartP99.Round(time.Millisecond),
		r.Takeovers, r.TakeoverMax.Round(time.Millisecond), len(r.Violations), short(r.Elapsed), short(r.Wall))
}

// short rounds d for the table: to 10 ms under 10 s, else to the second.
func short(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// runRec is one handler run.
type runRec struct {
	worker     string
	attempt    int
	start, end time.Time
}

type recorder struct {
	mu   sync.Mutex
	runs map[string][]runRec
	// conflicts counts claim conflicts; waits, the takeover waits.
	conflicts atomic.Int64
	takeovers []time.Duration
}

func (r *recorder) Claimed(e consumer.ClaimEvent) {
	if e.TakenOver > 0 {
		r.mu.Lock()
		r.takeovers = append(r.takeovers, e.Wait)
		r.mu.Unlock()
	}
}
func (r *recorder) ClaimConflict(string)          { r.conflicts.Add(1) }
func (r *recorder) Finished(consumer.FinishEvent) {}

// Run runs cfg inside the calling synctest bubble and returns what it
// measured. ctx bounds nothing virtual: cfg.Timeout does.
func Run(ctx context.Context, cfg Config) Result {
	cfg.defaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	var rngMu sync.Mutex
	random := func() float64 {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.Float64()
	}
	db := memstore.New(memstore.Config{
		Lanes: lanes,
		Latency: func(memstore.Op, string) time.Duration {
			return time.Duration(float64(cfg.Latency) * (0.5 + random()))
		},
		Fault: func(op memstore.Op, _ string) memstore.Fault {
			if op != memstore.OpUpdate || cfg.FaultRate == 0 {
				return memstore.Fault{}
			}
			if x := random(); x < cfg.FaultRate {
				return memstore.Fault{Err: memstore.ErrInjected, Applied: x < cfg.FaultRate/2}
			}
			return memstore.Fault{}
		},
	})
	rec := &recorder{runs: map[string][]runRec{}}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	mux := consumer.NewMux()
	mux.RegisterFunc("sim", func(ctx context.Context, job *consumer.Job) error {
		r := runRec{worker: job.WorkerID, attempt: job.Attempt, start: time.Now()}
		t := time.NewTimer(cfg.Work)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		r.end = time.Now()
		rec.mu.Lock()
		rec.runs[job.Task.Key] = append(rec.runs[job.Task.Key], r)
		rec.mu.Unlock()
		return context.Cause(ctx)
	})

	res := Result{Config: cfg}
	violate := func(format string, args ...any) {
		if len(res.Violations) < 20 {
			res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
		}
	}
	ids := make([]string, cfg.Workers)
	handles := make([]*memstore.Store, cfg.Workers)
	workers := make([]*consumer.Consumer, cfg.Workers)
	for i := range workers {
		ids[i] = fmt.Sprintf("w%04d", i)
		handles[i] = db.Open()
		c, err := consumer.New(consumer.Config{Store: handles[i], Handler: mux, WorkerID: ids[i],
			Concurrency: cfg.Concurrency, Logger: logger, Observer: rec, RetryPolicy: consumer.NoBackoff})
		if err != nil {
			violate("consumer %d: %v", i, err)
			return res
		}
		workers[i] = c
	}
	producer := db.Open()
	defer producer.Close()
	publish := func(i int) {
		p := task.PublishParams{Key: fmt.Sprintf("t%06d", i), Kind: "sim"}
		if cfg.PinEvery > 0 && i%cfg.PinEvery == 0 {
			// Pins go to the first half, kills to the second: a pinned
			// task's workers stay alive, so it can finish.
			half := max(cfg.Workers/2, 1)
			p.Options.SpecificWorkerIDs = []string{ids[int(random()*float64(half))], ids[int(random()*float64(half))]}
		}
		if cfg.LockEvery > 0 && i%cfg.LockEvery == 0 {
			p.Options.LockKeys = []string{fmt.Sprintf("dev:%d", int(random()*float64(cfg.LockKeys)))}
			p.Options.Priority = int(random() * 3)
		}
		for {
			if _, _, err := task.Publish(ctx, producer, p); err == nil {
				return
			} else if ctx.Err() != nil {
				return
			}
		}
	}
	for _, c := range workers {
		if err := c.Start(ctx); err != nil {
			violate("start: %v", err)
		}
	}
	// Every worker has read the registry with every other in it (the
	// heartbeat's refresh) before the first task: the run measures a
	// cluster, not its start.
	time.Sleep(1500 * time.Millisecond)
	if cfg.PublishEvery == 0 {
		// A burst, 50 publishers at once: a backlog to drain.
		var pubs sync.WaitGroup
		for p := range 50 {
			pubs.Go(func() {
				for i := p; i < cfg.Tasks; i += 50 {
					publish(i)
				}
			})
		}
		pubs.Wait()
	}
	start := time.Now()
	// The kills fall at random moments while tasks are published (or
	// within the first second of a drain), among the second half.
	window := max(cfg.PublishEvery*time.Duration(cfg.Tasks), time.Second)
	killed := map[int]bool{}
	var kills sync.WaitGroup
	for range min(cfg.Kill, cfg.Workers/2) {
		i := cfg.Workers/2 + int(random()*float64(cfg.Workers-cfg.Workers/2))
		if killed[i] {
			continue
		}
		killed[i] = true
		at := time.Duration(random() * float64(window))
		kills.Go(func() {
			time.Sleep(at)
			handles[i].Cut()
		})
	}
	if cfg.PublishEvery > 0 {
		next := time.Now()
		for i := range cfg.Tasks {
			publish(i)
			next = next.Add(cfg.PublishEvery)
			time.Sleep(time.Until(next))
		}
	}
	kills.Wait()
	// Wait for every task to finish.
	deadline := start.Add(cfg.Timeout)
	for db.Unfinished() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	res.Elapsed = time.Since(start)
	var events int64
	for i, h := range handles {
		if !killed[i] {
			events += h.Counts().Events
		}
	}
	live := cfg.Workers - len(killed)
	total := db.Counts()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	var stops sync.WaitGroup
	for _, c := range workers {
		stops.Go(func() { c.Stop(stopCtx) })
	}
	stops.Wait()
	cancel()
	for _, h := range handles {
		h.Close()
	}

	n := float64(cfg.Tasks)
	res.Writes = float64(total.Writes) / n
	res.Conflicts = float64(rec.conflicts.Load()) / n
	res.Reads, res.Rows = float64(total.Reads)/n, float64(total.CandidateRows)/n
	res.Events = float64(events) / float64(max(live, 1)) / n
	res.Takeovers = len(rec.takeovers)
	for _, w := range rec.takeovers {
		res.TakeoverMax = max(res.TakeoverMax, w)
	}
	check(cfg, db.Tasks(), rec.runs, &res, violate)
	return res
}

// check verifies the invariants over the stored tasks and the handler runs.
func check(cfg Config, tasks []*task.Task, runs map[string][]runRec, res *Result, violate func(string, ...any)) {
	if len(tasks) != cfg.Tasks {
		violate("%d tasks stored; %d published", len(tasks), cfg.Tasks)
	}
	var starts []time.Duration
	byLock := map[string][]string{}
	for _, t := range tasks {
		rs := runs[t.Key]
		if t.State != task.StateSucceeded {
			violate("task %s is %s, not succeeded (lost)", t.Key, t.State)
		}
		if len(rs) == 0 {
			violate("task %s never ran", t.Key)
			continue
		}
		slices.SortFunc(rs, func(a, b runRec) int { return a.start.Compare(b.start) })
		starts = append(starts, rs[0].start.Sub(t.CreatedAt))
		for i := 1; i < len(rs); i++ {
			if rs[i].start.Before(rs[i-1].end) {
				violate("task %s: attempt %d of %s started at %s while attempt %d of %s ran until %s (two live holders)",
					t.Key, rs[i].attempt, rs[i].worker, rs[i].start.Format(time.StampMicro), rs[i-1].attempt, rs[i-1].worker, rs[i-1].end.Format(time.StampMicro))
			}
		}
		for _, r := range rs {
			if !t.Allows(r.worker) {
				violate("task %s pinned to %v ran on %s", t.Key, t.SpecificWorkerIDs, r.worker)
			}
		}
		for _, k := range t.LockKeys {
			byLock[k] = append(byLock[k], t.Key)
		}
	}
	slices.Sort(starts)
	if len(starts) > 0 {
		res.StartP50 = starts[len(starts)/2]
		res.StartP99 = starts[min(len(starts)-1, len(starts)*99/100)]
	}
	byKey := map[string]*task.Task{}
	for _, t := range tasks {
		byKey[t.Key] = t
	}
	for lock, keys := range byLock {
		type span struct {
			key        string
			start, end time.Time
		}
		var spans []span
		for _, k := range keys {
			for _, r := range runs[k] {
				spans = append(spans, span{k, r.start, r.end})
			}
		}
		slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
		for i := 1; i < len(spans); i++ {
			if spans[i].start.Before(spans[i-1].end) {
				violate("lock %s: %s started at %s while %s held it until %s", lock, spans[i].key,
					spans[i].start.Format(time.StampMicro), spans[i-1].key, spans[i-1].end.Format(time.StampMicro))
			}
		}
		if cfg.Kill > 0 || cfg.FaultRate > 0 {
			continue // a dead worker's place in a line lapses: order may skip it
		}
		// The line: once the key is free, no task starts while a task of
		// that key ranking ahead has waited for over a second (time to
		// have tried and taken its place) and not started yet.
		for i := 1; i < len(spans); i++ {
			s := spans[i]
			st := byKey[s.key]
			for _, k := range keys {
				u := byKey[k]
				if len(runs[k]) == 0 {
					continue
				}
				first := runs[k][0].start
				for _, r := range runs[k] {
					first = minTime(first, r.start)
				}
				ahead := task.LockLine{Priority: st.Priority, Seq: st.Seq}.Ahead(u.Priority, u.Seq)
				if k != s.key && ahead && u.CreatedAt.Add(time.Second).Before(spans[i-1].end) && first.After(s.start) {
					violate("lock %s: %s (priority %d) started at %s before %s (priority %d), waiting since %s",
						lock, s.key, st.Priority, s.start.Format(time.StampMicro), k, u.Priority, u.CreatedAt.Format(time.StampMicro))
				}
			}
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Table prints results as the Markdown table under Header.
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString(Header)
	b.WriteByte('\n')
	slices.SortStableFunc(rs, func(a, b Result) int {
		return cmp.Or(cmp.Compare(a.Config.Tasks, b.Config.Tasks), cmp.Compare(a.Config.Workers, b.Config.Workers))
	})
	for _, r := range rs {
		b.WriteString(r.Row())
		b.WriteByte('\n')
	}
	return b.String()
}
