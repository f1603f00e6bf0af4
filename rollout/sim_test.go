package rollout

// Rollouts at fleet scale on virtual time: the in-memory store in a
// testing/synctest bubble, real consumers running the device tasks, a
// Stepper with its feed stepping as a driver does. The device count is
// LEASEPOOL_ROLLOUT_SIM_DEVICES (default 2,000, so the package's test run
// stays short; docs/performance.md runs 100,000).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

func simDevices(t *testing.T, def int) int {
	if v := os.Getenv("LEASEPOOL_ROLLOUT_SIM_DEVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 || n > MaxDevices {
			t.Fatalf("LEASEPOOL_ROLLOUT_SIM_DEVICES=%q: want 100 to %d", v, MaxDevices)
		}
		return n
	}
	return def
}

// realNow is the wall clock outside the bubble's virtual time: what a
// step costs in CPU and memory work.
func realNow() time.Duration {
	var tv syscall.Timeval
	_ = syscall.Gettimeofday(&tv)
	return time.Duration(tv.Nano())
}

// counted counts the document calls made through it.
type counted struct {
	task.Store
	docWrites, docReads atomic.Int64
}

func (c *counted) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	c.docWrites.Add(1)
	return c.Store.PutDocument(ctx, d)
}

func (c *counted) GetDocument(ctx context.Context, ns, id string) (task.Document, error) {
	c.docReads.Add(1)
	return c.Store.GetDocument(ctx, ns, id)
}

// simFleet plays the devices: a command takes latency, the devices fail
// says fail report failure (a rollback succeeds), and an offline device's
// commands are held by the worker's gate, with no write, until it
// returns (Ready, as mqttdev.Handler holds them).
type simFleet struct {
	fail    func(device string) bool
	latency time.Duration

	mu       sync.Mutex
	offline  map[string]chan struct{}
	inside   map[string]int
	overlaps []string
	// first is when each device first started a command of the rollout;
	// rolledBack the devices that ran the rollback.
	first      map[string]time.Time
	rolledBack map[string]int
}

func newSimFleet(fail func(string) bool, latency time.Duration) *simFleet {
	return &simFleet{fail: fail, latency: latency, offline: map[string]chan struct{}{}, inside: map[string]int{},
		first: map[string]time.Time{}, rolledBack: map[string]int{}}
}

func (f *simFleet) Ready(t *task.Task) (consumer.Hold, bool) {
	c, err := mqttdev.DecodePayload(t.Payload)
	if err != nil {
		return consumer.Hold{}, true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.offline[c.Device]; ok {
		return consumer.Hold{Wake: ch, Recheck: 24 * time.Hour}, false
	}
	return consumer.Hold{}, true
}

func (f *simFleet) goOffline(devices []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range devices {
		f.offline[d] = make(chan struct{})
	}
}

// comeBack brings device back and returns when.
func (f *simFleet) comeBack(device string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.offline[device]; ok {
		close(ch)
		delete(f.offline, device)
	}
	return time.Now()
}

func (f *simFleet) Handle(ctx context.Context, job *consumer.Job) error {
	c, err := mqttdev.DecodePayload(job.Task.Payload)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.inside[c.Device]++
	if f.inside[c.Device] > 1 {
		f.overlaps = append(f.overlaps, c.Device)
	}
	if _, ok := f.first[c.Device]; !ok {
		f.first[c.Device] = time.Now()
	}
	if c.Command == "rollback" {
		f.rolledBack[c.Device]++
	}
	f.mu.Unlock()
	select {
	case <-time.After(f.latency):
	case <-ctx.Done():
	}
	f.mu.Lock()
	f.inside[c.Device]--
	f.mu.Unlock()
	if f.fail(c.Device) && c.Command != "rollback" {
		return fmt.Errorf("task %s: %w: simulated", job.Task.Key, mqttdev.ErrDeviceFailed)
	}
	return ctx.Err()
}

// simWorld is a store, the worker handles running the fleet, and the
// driver's handle.
type simWorld struct {
	db      *memstore.DB
	workers []*memstore.Store
	driver  *counted
	drvMem  *memstore.Store
}

func newSimWorld(t *testing.T, f *simFleet, workers int) *simWorld {
	w := &simWorld{db: memstore.New(memstore.Config{Lanes: 2})}
	for i := range workers {
		h := w.db.Open()
		w.workers = append(w.workers, h)
		mux := consumer.NewMux()
		mux.Register(mqttdev.Kind, f)
		c, err := consumer.New(consumer.Config{Store: h, Handler: mux, WorkerID: fmt.Sprintf("w%d", i), Concurrency: 64,
			Logger: slog.New(slog.DiscardHandler), RetryPolicy: consumer.NoBackoff})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Stop(context.Background()) })
	}
	w.drvMem = w.db.Open()
	w.driver = &counted{Store: w.drvMem}
	return w
}

// taskWrites are the task writes of every handle.
func (w *simWorld) taskWrites() int64 {
	n := w.drvMem.Counts().Writes
	for _, h := range w.workers {
		n += h.Counts().Writes
	}
	return n
}

// simDriver steps a rollout every DefaultEvery as a driver does, its
// Stepper following the change stream, and times each step by the wall
// clock, by the wave the rollout is in after it.
type simDriver struct {
	st      Store
	stepper *Stepper
	stop    context.CancelFunc
	done    chan struct{}
	// perWave is the wall time spent stepping, steps the steps, by wave.
	perWave map[int]time.Duration
	steps   map[int]int
	slowest time.Duration
}

func newSimDriver(st Store) *simDriver {
	d := &simDriver{st: st, perWave: map[int]time.Duration{}, steps: map[int]int{}}
	d.takeOver()
	return d
}

// takeOver replaces the Stepper by a new one, as a driver that takes
// over from a dead one starts: nothing in memory.
func (d *simDriver) takeOver() {
	if d.stop != nil {
		d.stop()
		<-d.done
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.stepper, d.stop, d.done = NewStepper(d.st), cancel, make(chan struct{})
	go func() {
		defer close(d.done)
		d.stepper.Follow(ctx)
	}()
}

func (d *simDriver) close() {
	d.stop()
	<-d.done
}

// step steps name once and returns the rollout's document.
// stepUntil steps the driver on name every period of virtual time, as
// the elected worker's duty does, until done says the last step's
// rollout is where the test wants it, and returns that rollout.
func (d *simDriver) stepUntil(t *testing.T, name string, every time.Duration, done func(*Rollout) bool) *Rollout {
	for {
		if r := d.step(t, name); done(r) {
			return r
		}
		time.Sleep(every) // virtual time (synctest): the driver's period is the point
	}
}

func (d *simDriver) step(t *testing.T, name string) *Rollout {
	start := realNow()
	err := d.stepper.Step(context.Background(), name)
	took := realNow() - start
	if err != nil && !isConflict(err) {
		t.Fatal(err)
	}
	r, err := GetHead(context.Background(), d.st, name)
	if err != nil {
		t.Fatal(err)
	}
	d.perWave[r.Wave] += took
	d.steps[r.Wave]++
	d.slowest = max(d.slowest, took)
	return r
}

func isConflict(err error) bool { return errors.Is(err, task.ErrConflict) }

// A rollout over a fleet, 5 % of whose devices fail, all of them in the
// third wave (10 % to 50 %): waves 1 %, 10 %, 50 %, 100 %, at most 500
// dispatches a second, aborting when more than 3 % of the executions
// ended failed. The driver is taken over (a new Stepper, nothing in
// memory) once the second wave runs. It aborts in the third wave, the
// rollback runs on exactly the devices that succeeded, once each, the
// rate holds over the recorded dispatches and over the tasks' publish
// times, no device runs two commands at once, and the aggregates equal
// the executions counted one by one. Printed: store writes per device,
// driver time per wave.
func TestSimRolloutAtFleetScale(t *testing.T) {
	n := simDevices(t, 2000)
	ids := make([]string, n)
	index := map[string]int{}
	for i := range ids {
		ids[i] = fmt.Sprintf("dev-%06d", i)
		index[ids[i]] = i
	}
	failing := func(d string) bool {
		i := index[d]
		return i >= n/10 && i < n/2 && i%8 == 0
	}
	synctest.Test(t, func(t *testing.T) {
		f := newSimFleet(failing, 30*time.Millisecond)
		w := newSimWorld(t, f, 3)
		ctx := context.Background()
		waves, _ := ParseWaves("1%,10%,50%,100%")
		rules, _ := ParseAbortRules("failed>3% after 100")
		rate := Rate{N: 500, Per: task.Duration(time.Second)}
		if _, err := Create(ctx, w.driver, "fleet", Spec{Command: "update", Devices: ids, Waves: waves, Rate: rate,
			AbortWhen: rules, RollbackCommand: "rollback"}); err != nil {
			t.Fatal(err)
		}
		d := newSimDriver(w.driver)
		writes0, docWrites0 := w.taskWrites(), w.driver.docWrites.Load()
		start := time.Now()
		tookOver := false
		d.stepUntil(t, "fleet", DefaultEvery, func(r *Rollout) bool {
			if r.Wave == 1 && !tookOver {
				d.takeOver()
				tookOver = true
			}
			if !r.Over() && time.Since(start) > 24*time.Hour {
				t.Fatalf("not over after a day: %s, %+v", r.State, r.Progress().Total)
			}
			return r.Over()
		})
		elapsed := time.Since(start)
		d.close()
		synctest.Wait()

		r, err := Get(ctx, w.driver, "fleet")
		if err != nil {
			t.Fatal(err)
		}
		p := r.Progress() // counted from the executions
		head, err := GetHead(ctx, w.driver, "fleet")
		if err != nil {
			t.Fatal(err)
		}
		if hp := head.Progress(); hp.Total != p.Total || hp.RolledBack != p.RolledBack || fmt.Sprint(hp.Waves) != fmt.Sprint(p.Waves) {
			t.Fatalf("aggregates %+v %+v %+v differ from the executions' %+v %+v %+v", hp.Total, hp.RolledBack, hp.Waves, p.Total, p.RolledBack, p.Waves)
		}
		if r.State != StateAborted {
			t.Fatalf("state %s, want aborted: %+v", r.State, p.Total)
		}
		var aborted *Event
		for i := range r.Events {
			if r.Events[i].Type == EventAborted {
				aborted = &r.Events[i]
			}
		}
		if aborted == nil || aborted.Wave != 2 || fmt.Sprint(waveStates(p)) != "[ended/end ended/end aborted/end skipped/-]" {
			t.Fatalf("abort event %+v, waves %s: want the abort in wave 3, where the failures are", aborted, waveStates(p))
		}
		// The rate, over what was recorded and over what was published.
		checkRate(t, allDispatches(r), rate.N, time.Duration(rate.Per))
		tasks, err := w.driver.List(ctx, task.ListQuery{KeyPrefix: "rollout:fleet:"})
		if err != nil {
			t.Fatal(err)
		}
		var published []time.Time
		for _, tk := range tasks {
			if len(tk.Key) < 9 || tk.Key[len(tk.Key)-9:] != ":rollback" {
				published = append(published, tk.CreatedAt)
			}
		}
		slices.SortFunc(published, time.Time.Compare)
		checkRate(t, published, rate.N, time.Duration(rate.Per))
		// The rollback: on exactly the devices that succeeded, once each.
		succeeded := 0
		f.mu.Lock()
		for _, e := range r.Devices {
			ran := f.rolledBack[e.Device]
			switch {
			case e.Outcome == OutcomeSucceeded && (ran != 1 || e.Rollback != OutcomeSucceeded):
				t.Errorf("%s succeeded: rolled back %d times, rollback %q", e.Device, ran, e.Rollback)
			case e.Outcome != OutcomeSucceeded && (ran != 0 || e.Rollback != ""):
				t.Errorf("%s %s: rolled back %d times", e.Device, e.Outcome, ran)
			}
			if e.Outcome == OutcomeSucceeded {
				succeeded++
			}
			if e.Outcome == OutcomeFailed && !failing(e.Device) {
				t.Errorf("%s failed, a healthy device", e.Device)
			}
		}
		overlaps := len(f.overlaps)
		f.mu.Unlock()
		if overlaps > 0 {
			t.Fatalf("%d times a device ran two commands at once", overlaps)
		}
		if p.RolledBack.Succeeded != succeeded {
			t.Fatalf("rolled back %d, %d succeeded", p.RolledBack.Succeeded, succeeded)
		}

		acted := 0
		for _, e := range r.Devices {
			if e.Attempt > 0 {
				acted++
			}
		}
		taskWrites, docWrites := w.taskWrites()-writes0, w.driver.docWrites.Load()-docWrites0
		t.Logf("%d devices, %d dispatched (%d failed, %d cancelled, %d skipped), %d rolled back; %s of virtual time",
			n, acted, p.Total.Failures(), p.Total.Cancelled, p.Total.Skipped, p.RolledBack.Succeeded, elapsed.Round(time.Second))
		t.Logf("store writes per device dispatched: %.3f rollout documents (rollout and shards), %.2f task writes (publish, claim, finish, rollback: workers' and driver's)",
			float64(docWrites)/float64(acted), float64(taskWrites)/float64(acted))
		t.Logf("driver task reads per device dispatched: %.2f; slowest step %s", float64(w.drvMem.Counts().Reads)/float64(acted), d.slowest.Round(time.Microsecond))
		for wave := range r.Waves {
			if d.steps[wave] > 0 {
				t.Logf("wave %d (%d devices): driver time %s over %d steps (%s a step)", wave+1, r.Waves[wave].End-r.Waves[wave].Start,
					d.perWave[wave].Round(time.Millisecond), d.steps[wave], (d.perWave[wave] / time.Duration(d.steps[wave])).Round(time.Microsecond))
			}
		}
	})
}

// A rollout with 10 % of its devices offline for an hour: while they stay
// away nothing is written for them (no task write, no rollout write) and
// the driver reads no task; coming back over 10 s, each runs within a
// second of its return.
func TestSimRolloutWithOfflineDevices(t *testing.T) {
	n := simDevices(t, 2000)
	ids := make([]string, n)
	var away []string
	for i := range ids {
		ids[i] = fmt.Sprintf("dev-%06d", i)
		if i%10 == 3 {
			away = append(away, ids[i])
		}
	}
	synctest.Test(t, func(t *testing.T) {
		f := newSimFleet(func(string) bool { return false }, 30*time.Millisecond)
		f.goOffline(away)
		w := newSimWorld(t, f, 3)
		ctx := context.Background()
		rate := Rate{N: 1000, Per: task.Duration(time.Second)}
		if _, err := Create(ctx, w.driver, "away", Spec{Command: "update", Devices: ids, Rate: rate,
			OfflineLimit: task.Duration(2 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		d := newSimDriver(w.driver)
		defer d.close()
		online := n - len(away)
		d.stepUntil(t, "away", DefaultEvery, func(r *Rollout) bool { return r.Waves[0].Counts.Succeeded >= online })
		// Every online device done; the offline ones' commands published
		// and held. A few steps settle what is in flight.
		settle := 0
		d.stepUntil(t, "away", DefaultEvery, func(*Rollout) bool { settle++; return settle == 10 })
		synctest.Wait()
		writes, docWrites, reads := w.taskWrites(), w.driver.docWrites.Load(), w.drvMem.Counts().Reads
		// A step every 2 s rather than every 200 ms: what a step reads
		// and writes does not depend on how often it comes, and the hour
		// costs a tenth of the wall time.
		steps := 0
		hour := time.Now().Add(time.Hour)
		d.stepUntil(t, "away", 10*DefaultEvery, func(r *Rollout) bool {
			if r.Waves[0].Counts.Running != len(away) {
				t.Fatalf("%+v, want %d running", r.Waves[0].Counts, len(away))
			}
			steps++
			return !time.Now().Before(hour)
		})
		dw, ddw, dr := w.taskWrites()-writes, w.driver.docWrites.Load()-docWrites, w.drvMem.Counts().Reads-reads
		t.Logf("an hour with %d devices offline, %d driver steps: %d task writes, %d rollout writes, %d task reads by the driver",
			len(away), steps, dw, ddw, dr)
		if dw != 0 || ddw != 0 || dr != 0 {
			t.Fatalf("writes or reads while the devices stay away")
		}
		// They come back over 10 s, in id order, as a fleet reconnects
		// (all at one instant, the workers' slots would set the pace).
		back := map[string]time.Time{}
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			for _, dev := range away {
				back[dev] = f.comeBack(dev)
				time.Sleep(10 * time.Second / time.Duration(len(away))) // virtual time: the returns' pace is the point
			}
		}()
		d.stepUntil(t, "away", DefaultEvery, (*Rollout).Over)
		<-returned
		var slowest time.Duration
		f.mu.Lock()
		for _, dev := range away {
			if s := f.first[dev].Sub(back[dev]); s > slowest {
				slowest = s
			}
		}
		f.mu.Unlock()
		t.Logf("back over 10 s: the slowest ran its command %s after its return", slowest)
		if slowest > time.Second {
			t.Fatalf("a device ran its command %s after its return, want within a second", slowest)
		}
	})
}
