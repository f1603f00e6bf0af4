package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/consumer"
	lptestutil "github.com/leasepool/leasepool/internal/testutil" // testutil is prometheus's here
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	kind     = "job"
	waitLong = 20 * time.Second
)

// openStore opens a fresh embedded store file, closed when the test ends.
func openStore(t *testing.T) *sqlitestore.Store {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "tasks.db"), &sqlitestore.Config{Logger: log})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func publish(t *testing.T, s task.Store, key string, retries int) {
	t.Helper()
	p := task.PublishParams{Key: key, Kind: kind}
	p.MaxUnexpectedRetries, p.PingInterval, p.WorkerTimeout = retries, 100*time.Millisecond, 1500*time.Millisecond
	if _, _, err := task.Publish(context.Background(), s, p); err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
}

// value returns the value of the sample of name whose labels include
// labels (a counter's value, a histogram's count), or -1 when none.
func value(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, want) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				}
			}
		}
	}
	return -1
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// conflictOnce is the real store, except that just before the first
// Update of key it writes that task itself through the inner store, so the
// update meets a genuine compare-and-set conflict.
// It counts every conflict its updates meet.
type conflictOnce struct {
	task.Store
	key       string
	once      sync.Once
	conflicts atomic.Int64
}

func (c *conflictOnce) Update(ctx context.Context, t *task.Task) error {
	if t.Key == c.key {
		c.once.Do(func() {
			_, err := task.Modify(ctx, c.Store, c.key, func(t *task.Task) error { t.Priority++; return nil })
			if err != nil {
				panic(fmt.Sprintf("interfering write: %v", err))
			}
		})
	}
	err := c.Store.Update(ctx, t)
	if errors.Is(err, task.ErrConflict) {
		c.conflicts.Add(1)
	}
	return err
}

// TestWorkerMetrics runs a real consumer on a real store through known
// outcomes and checks every counter: two tasks succeed, one fails once and
// is retried (then succeeds), one fails for good, one loses its lease to a
// thief, one is taken over from a crashed holder, and one claim meets a
// compare-and-set conflict.
func TestWorkerMetrics(t *testing.T) {
	s := openStore(t)
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	stolen := make(chan struct{})
	var flakyRuns sync.Map
	handler := func(ctx context.Context, job *consumer.Job) error {
		switch job.Task.Key {
		case "flaky":
			if _, again := flakyRuns.LoadOrStore(job.Task.Key, true); !again {
				return errors.New("first attempt fails")
			}
		case "doomed":
			return errors.New("always fails")
		case "lost":
			close(stolen)
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return nil
	}
	crashedClaim(t, s, "orphan")
	publish(t, s, "ok-1", 3)
	publish(t, s, "ok-2", 3)
	publish(t, s, "flaky", 3)
	publish(t, s, "doomed", task.NoRetries)
	publish(t, s, "lost", 3)
	publish(t, s, "contested", 3)

	contested := &conflictOnce{Store: s, key: "contested"}
	c, err := consumer.New(consumer.Config{
		Store: contested, Handler: consumer.HandlerFunc(handler),
		WorkerID: "w1", Kinds: []string{kind}, RetryPolicy: consumer.NoBackoff, Observer: m,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(context.Background()) }()

	<-stolen
	steal(t, s, "lost")
	finished := func(outcome string) float64 {
		return value(t, reg, "leasepool_tasks_finished_total", "kind", kind, "outcome", outcome)
	}
	lptestutil.Eventually(t, waitLong, "5 succeeded (ok-1, ok-2, flaky, orphan, contested), 1 retried, 1 failed, 1 lease lost", func() bool {
		return finished("succeeded") == 5 && finished("retried") == 1 && finished("failed") == 1 && finished("lease_lost") == 1
	})
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"leasepool_tasks_claimed_total", []string{"kind", kind}, 8}, // 7 tasks, flaky twice
		{"leasepool_tasks_taken_over_total", []string{"kind", kind}, 1},
		{"leasepool_task_wait_seconds", []string{"kind", kind}, 8},
		{"leasepool_handler_duration_seconds", []string{"kind", kind, "outcome", "succeeded"}, 5},
		{"leasepool_handler_duration_seconds", []string{"kind", kind, "outcome", "lease_lost"}, 1},
		{"leasepool_tasks_finished_total", []string{"kind", kind, "outcome", "succeeded"}, 5},
		{"leasepool_tasks_finished_total", []string{"kind", kind, "outcome", "retried"}, 1},
		{"leasepool_tasks_finished_total", []string{"kind", kind, "outcome", "failed"}, 1},
		{"leasepool_tasks_finished_total", []string{"kind", kind, "outcome", "lease_lost"}, 1},
	}
	for _, ck := range checks {
		if got := value(t, reg, ck.name, ck.labels...); got != ck.want {
			t.Errorf("%s%v = %v, want %v", ck.name, ck.labels, got, ck.want)
		}
	}
	// The injected conflict, and perhaps claims from a stale copy of a
	// task in the heap: at most every conflict the store returned.
	if got, most := value(t, reg, "leasepool_claim_conflicts_total", "kind", kind), contested.conflicts.Load(); got < 1 || got > float64(most) {
		t.Errorf("claim conflicts = %v, want 1 to %d (the store's conflicts)", got, most)
	}
	if n, err := testutil.GatherAndCount(reg, "leasepool_tasks_finished_total"); err != nil || n != 4 {
		t.Errorf("finished_total has %d series (err %v), want 4 (no other outcome)", n, err)
	}
}

// crashedClaim publishes key already claimed by a holder that has since
// died: its lease runs out 200ms later and nobody renews it.
func crashedClaim(t *testing.T, s task.Store, key string) {
	t.Helper()
	publish(t, s, key, 3)
	_, err := task.Modify(context.Background(), s, key, func(doc *task.Task) error {
		doc.WorkerTimeout = task.Duration(200 * time.Millisecond)
		doc.Claim(task.Holder{TaskKey: key, WorkerID: "crashed", Instance: "gone"}, s.Now())
		return nil
	})
	if err != nil {
		t.Fatalf("claim %s as a crashed worker: %v", key, err)
	}
}

// steal gives key's running lease to another process for an hour, as a
// peer's claim after a missed renewal would.
func steal(t *testing.T, s task.Store, key string) {
	t.Helper()
	_, err := task.Modify(context.Background(), s, key, func(doc *task.Task) error {
		for i := range doc.Attempts {
			if w := &doc.Attempts[i]; w.State == task.AttemptRunning {
				w.WorkerID, w.Instance, w.LeaseUntil = "thief", "thief-1", s.Now().Add(time.Hour)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("steal %s: %v", key, err)
	}
}

// countingStats counts the stats reads that reach the real store.
type countingStats struct {
	task.Store
	reads atomic.Int64
}

func (c *countingStats) Stats(ctx context.Context) (task.Stats, error) {
	c.reads.Add(1)
	return c.Store.Stats(ctx)
}

// TestStoreCollector checks the gauges against a real store and worker
// registry, that scrapes within MaxAge cost no store read, and that a
// state and kind that empties reads 0 rather than vanishing.
func TestStoreCollector(t *testing.T) {
	s := openStore(t)
	publish(t, s, "a", 3)
	publish(t, s, "b", 3)
	stats := &countingStats{Store: s}
	reg := prometheus.NewPedanticRegistry()
	col, err := metrics.NewStoreCollector(metrics.StoreConfig{Stats: stats, Registry: s, Now: s.Now, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(col)
	c, err := consumer.New(consumer.Config{Store: s, Handler: consumer.HandlerFunc(func(context.Context, *consumer.Job) error { return nil }),
		WorkerID: "w1", Kinds: []string{"none"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(context.Background()) }()

	if got := value(t, reg, "leasepool_tasks", "state", "pending", "kind", kind); got != 2 {
		t.Errorf("tasks{pending,%s} = %v, want 2", kind, got)
	}
	if got := value(t, reg, "leasepool_oldest_ready_task_age_seconds"); got <= 0 {
		t.Errorf("oldest ready age = %v, want > 0", got)
	}
	if got := value(t, reg, "leasepool_workers_live"); got != 1 {
		t.Errorf("workers_live = %v, want 1", got)
	}
	if got := value(t, reg, "leasepool_store_up"); got != 1 {
		t.Errorf("store_up = %v, want 1", got)
	}
	if n := stats.reads.Load(); n != 1 {
		t.Errorf("%d store reads for 4 scrapes within MaxAge, want 1", n)
	}

	fresh, err := metrics.NewStoreCollector(metrics.StoreConfig{Stats: stats, Now: s.Now, MaxAge: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testutil.CollectAndFormat(fresh, expfmt.TypeTextPlain, "leasepool_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := task.Cancel(context.Background(), s, k); err != nil {
			t.Fatal(err)
		}
	}
	out, err := testutil.CollectAndFormat(fresh, expfmt.TypeTextPlain, "leasepool_tasks", "leasepool_oldest_ready_task_age_seconds")
	text := string(out)
	for _, want := range []string{`leasepool_tasks{kind="job",state="cancelled"} 2`, `leasepool_tasks{kind="job",state="pending"} 0`,
		"leasepool_oldest_ready_task_age_seconds 0"} {
		if err != nil || !strings.Contains(text, want) {
			t.Errorf("after cancelling both, want %s in:\n%s (err %v)", want, text, err)
		}
	}
	if n := stats.reads.Load(); n != 3 {
		t.Errorf("%d store reads, want 3 (one per scrape past MaxAge)", n)
	}
}

// TestDeviceCommandMetrics checks the device observer's mapping: every
// outcome counted, only answered commands in the round-trip histogram.
func TestDeviceCommandMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []mqttdev.CommandOutcome{mqttdev.CommandOK, mqttdev.CommandOK, mqttdev.CommandDeviceFailed, mqttdev.CommandNoAck, mqttdev.CommandResultTimeout} {
		m.CommandDone(mqttdev.CommandEvent{Outcome: o, Duration: 300 * time.Millisecond})
	}
	for o, want := range map[string]float64{"ok": 2, "device_failed": 1, "no_ack": 1, "result_timeout": 1} {
		if got := value(t, reg, "leasepool_device_commands_total", "outcome", o); got != want {
			t.Errorf("device_commands_total{%s} = %v, want %v", o, got, want)
		}
	}
	if got := value(t, reg, "leasepool_device_command_round_trip_seconds"); got != 3 {
		t.Errorf("round trips observed: %v, want 3 (ok and device_failed only)", got)
	}
}

// TestFlowGauges: leasepool_flows has a series for every flow state, 0
// when none, so an alert on rollback_failed always has one to read.
func TestFlowGauges(t *testing.T) {
	s := openStore(t)
	counts := map[string]int64{"rollback_failed": 2, "running": 5}
	col, err := metrics.NewStoreCollector(metrics.StoreConfig{Now: s.Now,
		Flows: metrics.FlowCounterFunc(func(context.Context) (map[string]int64, error) { return counts, nil })})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	for state, want := range map[string]float64{"rollback_failed": 2, "running": 5, "failed": 0, "succeeded": 0} {
		if got := value(t, reg, "leasepool_flows", "state", state); got != want {
			t.Errorf("flows{%s} = %v, want %v", state, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "leasepool_flows"); err != nil || n != len(metrics.FlowStates) {
		t.Errorf("leasepool_flows series = %d (%v), want %d", n, err, len(metrics.FlowStates))
	}
}

// TestGroupMetrics: claims and running attempts per group, for grouped
// tasks only.
func TestGroupMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.Claimed(consumer.ClaimEvent{Kind: "k", Group: "acme"})
	}
	m.Claimed(consumer.ClaimEvent{Kind: "k"})
	m.Finished(consumer.FinishEvent{Kind: "k", Group: "acme", Outcome: consumer.OutcomeSucceeded, Started: true})
	if got := value(t, reg, "leasepool_group_tasks_claimed_total", "group", "acme"); got != 3 {
		t.Errorf("group_tasks_claimed_total{acme} = %v, want 3", got)
	}
	if got := value(t, reg, "leasepool_group_tasks_running", "group", "acme"); got != 2 {
		t.Errorf("group_tasks_running{acme} = %v, want 2", got)
	}
}
