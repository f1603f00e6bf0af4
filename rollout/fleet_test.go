package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// fleet is a consumer whose device handler plays a fleet: devices in fail
// report failure, devices in offline stay away, the others succeed after
// latency. It records every command each device started, and any device
// that ran two commands at once.
type fleet struct {
	st      task.Store
	fail    map[string]bool
	offline map[string]bool
	latency time.Duration

	mu       sync.Mutex
	runs     []run
	inside   map[string]int
	overlaps []string
}

type run struct {
	device, key, command string
	attempt              int
	start, end           time.Time
}

func newFleet(t *testing.T, st task.Store, workers int, fail, offline map[string]bool, latency time.Duration) *fleet {
	t.Helper()
	f := &fleet{st: st, fail: fail, offline: offline, latency: latency, inside: map[string]int{}}
	for i := range workers {
		mux := consumer.NewMux()
		mux.RegisterFunc(mqttdev.Kind, f.handle)
		c, err := consumer.New(consumer.Config{Store: st, Handler: mux, WorkerID: fmt.Sprintf("w%d", i), Concurrency: 16,
			Logger: slog.New(slog.DiscardHandler), RetryPolicy: consumer.NoBackoff})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Stop(context.Background()) })
	}
	return f
}

func (f *fleet) handle(ctx context.Context, job *consumer.Job) error {
	c, err := mqttdev.DecodePayload(job.Task.Payload)
	if err != nil {
		return err
	}
	if f.offline[c.Device] {
		return fmt.Errorf("%w for longer than offline_timeout", mqttdev.ErrOffline)
	}
	r := run{device: c.Device, key: job.Task.Key, command: c.Command, attempt: job.Attempt, start: f.st.Now()}
	f.mu.Lock()
	f.inside[c.Device]++
	if f.inside[c.Device] > 1 {
		f.overlaps = append(f.overlaps, c.Device)
	}
	f.mu.Unlock()
	select {
	case <-time.After(f.latency):
	case <-ctx.Done():
	}
	r.end = f.st.Now()
	f.mu.Lock()
	f.inside[c.Device]--
	f.runs = append(f.runs, r)
	f.mu.Unlock()
	if f.fail[c.Device] && !strings.HasPrefix(c.Command, "rollback") {
		return fmt.Errorf("task %s: %w: simulated", job.Task.Key, mqttdev.ErrDeviceFailed)
	}
	return ctx.Err()
}

func (f *fleet) ran() []run {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]run(nil), f.runs...)
}

// drive steps rollout name with s until it is over (its rollback too),
// or fails the test after limit.
func drive(t *testing.T, s *Stepper, name string, limit time.Duration) *Rollout {
	t.Helper()
	ctx := context.Background()
	var r *Rollout
	defer func() {
		if t.Failed() && r != nil {
			t.Logf("rollout %s: %s, %+v", name, r.State, r.Progress().Total)
		}
	}()
	// A step each check, as a driver does.
	testutil.EventuallyEvery(t, limit, 20*time.Millisecond, fmt.Sprintf("rollout %s to be over, its rollback too", name), func() bool {
		if err := s.Step(ctx, name); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		var err error
		if r, err = Get(ctx, s.st, name); err != nil {
			t.Fatal(err)
		}
		return r.State.Final() && (r.Rollback == nil || !r.Rollback.EndedAt.IsZero())
	})
	return r
}

func eventTypes(r *Rollout) []string {
	var out []string
	for _, e := range r.Events {
		out = append(out, fmt.Sprintf("%s@%d", e.Type, e.Wave+1))
	}
	return out
}

// allDispatches are every dispatch time the rollout recorded, sorted.
func allDispatches(r *Rollout) []time.Time {
	var out []time.Time
	for _, e := range r.Devices {
		out = append(out, e.Dispatched...)
	}
	sortTimes(out)
	return out
}

func sortTimes(ts []time.Time) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j].Before(ts[j-1]); j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

func TestHealthyRolloutCompletesEveryWaveInOrder(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	f := newFleet(t, st, 2, nil, nil, 5*time.Millisecond)
	waves, _ := ParseWaves("1,10%,50%,100%")
	rate := Rate{N: 25, Per: task.Duration(200 * time.Millisecond)}
	if _, err := Create(context.Background(), st, "healthy", Spec{Command: "update", Devices: devices(60), Waves: waves, Rate: rate,
		AbortWhen: []AbortRule{{Kinds: FailureKinds, Percent: 5, After: 5}}}); err != nil {
		t.Fatal(err)
	}
	r := drive(t, NewStepper(st), "healthy", time.Minute)
	if r.State != StateCompleted {
		t.Fatalf("state %s (%s)", r.State, r.Reason)
	}
	want := "[rollout.created@1 rollout.wave_started@1 rollout.wave_ended@1 rollout.wave_started@2 rollout.wave_ended@2 " +
		"rollout.wave_started@3 rollout.wave_ended@3 rollout.wave_started@4 rollout.wave_ended@4 rollout.completed@4]"
	if got := fmt.Sprint(eventTypes(r)); got != want {
		t.Fatalf("events %s\nwant %s", got, want)
	}
	for i := 1; i < len(r.Waves); i++ {
		if r.Waves[i].StartedAt.Before(r.Waves[i-1].EndedAt) {
			t.Errorf("wave %d started before wave %d ended", i+1, i)
		}
	}
	p := r.Progress()
	if p.Total.Succeeded != 60 || p.Waves[1].Target != 6 || p.Waves[3].Counts.Succeeded != 30 {
		t.Fatalf("progress %+v", p)
	}
	checkRate(t, allDispatches(r), rate.N, time.Duration(rate.Per))
	checkRuns(t, f, r)
}

// checkRuns checks that each task attempt ran at most once and that no
// device ran two commands at once.
func checkRuns(t *testing.T, f *fleet, r *Rollout) {
	t.Helper()
	seen := map[string]bool{}
	for _, run := range f.ran() {
		if seen[run.key+"#"+fmt.Sprint(run.attempt)] {
			t.Errorf("%s attempt %d ran twice", run.key, run.attempt)
		}
		seen[run.key+"#"+fmt.Sprint(run.attempt)] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.overlaps) > 0 {
		t.Errorf("devices ran two commands at once: %v", f.overlaps)
	}
}
