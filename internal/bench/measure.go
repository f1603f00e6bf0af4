package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// latencyGap separates the publishes of a latency run, so each task meets
// an idle worker.
const latencyGap = 2 * time.Millisecond

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
	published, err := b.publishPaced(b.keyPrefix("lat"), b.cfg.LatencyTasks, latencyGap)
	if err != nil {
		return err
	}
	if err := b.waitDrained(time.Minute); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	lat := Latencies(published, started)
	b.res.Samples.InProcess = lat
	s, r := Summarize(lat), b.report
	r.InProcessP50Ms, r.InProcessP90Ms, r.InProcessP99Ms, r.InProcessMaxMs = s.P50, s.P90, s.P99, s.Max
	return nil
}

func (b *bench) latencyCrossProcess() error {
	p, err := b.spawnWorker("bench-lat", 8)
	if err != nil {
		return err
	}
	defer p.Stop()
	// As the peers' harness does, publish once the worker is ready: a
	// task published during its start-up would time the start-up.
	if err := b.waitRegistered(p); err != nil {
		return err
	}
	published, err := b.publishPaced(b.keyPrefix("xlat"), b.cfg.LatencyTasks, latencyGap)
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
		if len(t.Attempts) > 0 {
			started[key] = t.Attempts[len(t.Attempts)-1].EndedAt
		}
	}
	lat := Latencies(published, started)
	b.res.Samples.CrossProcess = lat
	b.report.CrossProcessLatency = CrossProcess(lat)
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

// throughput drains ThroughputTasks noop tasks in this process, then in a
// worker process, Runs times each, and reports the medians.
func (b *bench) throughput() error {
	var inProc, cross []float64
	runs := b.cfg.Runs
	for run := range runs {
		if !b.cfg.ThroughputOnly {
			b.progress("throughput run %d/%d in one process", run+1, runs)
			perS, err := b.throughputInProcess()
			if err != nil {
				return err
			}
			inProc = append(inProc, perS)
		}
		b.progress("throughput run %d/%d in a worker process", run+1, runs)
		perS, err := b.throughputWorkerProcess()
		if err != nil {
			return err
		}
		cross = append(cross, perS)
	}
	if len(inProc) > 0 {
		b.report.InProcessThroughputPerS = Median(inProc)
	}
	b.report.CrossProcessThroughputRuns, b.report.CrossProcessThroughputPerS = slices.Clone(cross), Median(cross)
	return nil
}

func (b *bench) throughputInProcess() (float64, error) {
	n := b.cfg.ThroughputTasks
	if err := b.prepublish(b.keyPrefix("tput"), n, time.Time{}); err != nil {
		return 0, err
	}
	var finished atomic.Int64
	drained := make(chan struct{})
	start := time.Now()
	w, err := b.worker(b.cfg.Concurrency, nil, func(*consumer.Job, error) {
		if finished.Add(1) == int64(n) {
			close(drained)
		}
	})
	if err != nil {
		return 0, err
	}
	select {
	case <-drained:
	case <-time.After(5 * time.Minute):
		err = ErrTimedOut
	}
	elapsed := time.Since(start)
	w.Stop(context.Background())
	return float64(n) / elapsed.Seconds(), err
}

func (b *bench) throughputWorkerProcess() (float64, error) {
	n := b.cfg.ThroughputTasks
	if err := b.prepublish(b.keyPrefix("xtput"), n, time.Time{}); err != nil {
		return 0, err
	}
	start := time.Now()
	p, err := b.spawnWorker("bench-tput", b.cfg.Concurrency)
	if err != nil {
		return 0, err
	}
	err = b.waitDrained(5 * time.Minute)
	elapsed := time.Since(start)
	b.report.WorkerPeakRSSBytes = max(b.report.WorkerPeakRSSBytes, p.RSS("VmHWM"))
	p.Stop()
	return float64(n) / elapsed.Seconds(), err
}

// takeover SIGKILLs a worker 3 s into a long task and measures how long
// until an idle peer starts it, with the default lease.
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
	defer holder.Stop()
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
	defer peer.Stop()
	time.Sleep(time.Until(doc.Attempts[0].StartedAt.Add(3 * time.Second)))
	b.report.WorkerIdleRSSBytes = peer.RSS("VmRSS")
	killed := time.Now()
	holder.Kill()
	if err := b.poll(time.Minute, func() (bool, error) {
		doc, err = b.store.Get(b.ctx, key)
		return err == nil && len(doc.Attempts) > 1, err
	}); err != nil {
		return err
	}
	b.report.TakeoverMs = Ms(doc.Attempts[len(doc.Attempts)-1].StartedAt.Sub(killed))
	b.report.DefaultWorkerTimeoutMs = Ms(task.DefaultWorkerTimeout)
	return nil
}

func (b *bench) pendingMemory() error {
	n := b.cfg.PendingTasks
	if n == 0 {
		return nil
	}
	// Delayed, so the worker holds them in its bounded heap without running them.
	if err := b.prepublish(b.keyPrefix("pending"), n, time.Now().Add(time.Hour)); err != nil {
		return err
	}
	p, err := b.spawnWorker("bench-pending", b.cfg.Concurrency)
	if err != nil {
		return err
	}
	defer p.Stop()
	time.Sleep(3 * time.Second) // let it query and settle
	b.report.WorkerRSSWithPendingBytes = p.RSS("VmHWM")
	return nil
}

// worker starts an in-process consumer running noop tasks.
func (b *bench) worker(concurrency int, onStart func(*consumer.Job), onFinish func(*consumer.Job, error)) (*consumer.Consumer, error) {
	mux := consumer.NewMux()
	mux.Use(hooks(onStart, onFinish))
	mux.RegisterFunc("noop", func(context.Context, *consumer.Job) error { return nil })
	w, err := consumer.New(consumer.Config{Store: b.store, Handler: mux, Concurrency: concurrency,
		Logger: b.cfg.Logger, WorkerID: fmt.Sprintf("bench-inproc-%d", b.round)})
	if err != nil {
		return nil, err
	}
	return w, w.Start(b.ctx)
}

func (b *bench) spawnWorker(id string, concurrency int) (*Process, error) {
	return Start(b.cfg.WorkerCommand(b.cfg.StoreURL, fmt.Sprintf("%s-%d", id, b.round), concurrency))
}

// waitRegistered waits until worker process p has registered (its
// consumer has started: the peers' "ready").
func (b *bench) waitRegistered(p *Process) error {
	pid := p.Cmd.Process.Pid
	err := Poll(b.ctx, 30*time.Second, 5*time.Millisecond, func() (bool, error) {
		ws, err := b.store.Workers(b.ctx)
		return slices.ContainsFunc(ws, func(w task.WorkerInfo) bool { return w.PID == pid }), err
	})
	if err != nil {
		return fmt.Errorf("worker process %d not registered: %w", pid, err)
	}
	return nil
}

// waitDrained waits until no task is pending or running, with the indexed
// candidate query (a state scan would compete with the worker for CPU).
func (b *bench) waitDrained(limit time.Duration) error {
	return Poll(b.ctx, limit, 5*time.Millisecond, func() (bool, error) {
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
	return Poll(b.ctx, limit, 20*time.Millisecond, done)
}

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
