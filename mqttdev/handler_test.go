package mqttdev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// tlog sends slog records to t.Log.
type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("MQTTDEV_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type env struct {
	broker  *broker.Broker
	url     string
	prefix  string
	handler *Handler
	fault   *FaultTransport
	sim     *device.Simulator
}

type setupOpts struct {
	url      string // empty: an embedded broker
	sim      device.Config
	observer CommandObserver
}

// setup starts a broker (unless o.url is set), a simulator and a handler,
// and stops them at cleanup in the reverse order.
func setup(t *testing.T, o setupOpts) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := &env{url: o.url, prefix: "t" + NewCorrelationID()[:12]}
	if e.url == "" {
		b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		e.broker, e.url = b, b.URL()
	}
	sc := o.sim
	sc.BrokerURL, sc.Prefix, sc.Logger = e.url, e.prefix, testLogger(t).With("side", "sim")
	if sc.Count == 0 {
		sc.Count = 1
	}
	sc.IDPrefix = e.prefix + "-dev-"
	sim, err := device.NewSimulator(sc)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		if err := sim.Stop(sctx); err != nil {
			t.Error(err)
		}
	})
	e.sim = sim
	h, err := NewHandler(HandlerConfig{
		ClientConfig:   ClientConfig{BrokerURL: e.url, ClientID: e.prefix + "-worker"},
		Prefix:         e.prefix,
		Logger:         testLogger(t).With("side", "worker"),
		OfflineRecheck: 3 * time.Second,
		Observer:       o.observer,
		WrapTransport: func(tr Transport) Transport {
			e.fault = NewFaultTransport(tr)
			return e.fault
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		if err := h.Stop(sctx); err != nil {
			t.Error(err)
		}
	})
	e.handler = h
	// The handler must be subscribed before commands go out: wait until it
	// has seen every simulated device's retained online status.
	for _, d := range sim.Devices() {
		testutil.Eventually(t, 10*time.Second, "device "+d.ID()+" online at the worker", func() bool {
			s, ok := h.Tracker().State(d.ID())
			return ok && s.Online
		})
	}
	return e
}

func (e *env) dev(i int) string { return e.sim.Device(i).ID() }

func job(key string, attempt int, c Command) *consumer.Job {
	p, err := PublishParams(key, c, task.Options{})
	if err != nil {
		panic(err)
	}
	return &consumer.Job{Task: &task.Task{Key: p.Key, Kind: p.Kind, Payload: p.Payload}, Attempt: attempt, WorkerID: "w1"}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// testCore is the core scenario: a command is acked, runs and returns.
func testCore(t *testing.T, e *env) {
	j := job("core-1", 1, Command{Device: e.dev(0), Command: "blink", Args: json.RawMessage(`{"n":2}`)})
	err := e.handler.Handle(ctxT(t, 20*time.Second), j)
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	// Sent, acked and result go into the attempt's log: the task's history
	// and the event stream's logged events.
	var logged []string
	for _, l := range j.Output().Log {
		logged = append(logged, l.Msg)
	}
	dev := e.dev(0)
	if want := []string{"device " + dev + ": command blink sent", "device " + dev + ": command blink acked", "device " + dev + ": command blink result: ok"}; !slices.Equal(logged, want) {
		t.Errorf("attempt log %q, want %q", logged, want)
	}
	r := e.sim.Report()
	if len(r.Runs) != 1 || r.Runs[0].TaskKey != "core-1" || r.Runs[0].Attempt != 1 || r.Runs[0].Command != "blink" || !r.Runs[0].OK {
		t.Fatalf("runs: %+v", r.Runs)
	}
	if len(r.Overlaps)+len(r.StaleAttempts) != 0 {
		t.Fatalf("report: %+v", r)
	}
}

func TestCommandAckedAndResult(t *testing.T) {
	t.Parallel()
	testCore(t, setup(t, setupOpts{sim: device.Config{Latency: 50 * time.Millisecond}}))
}

func TestCommandAckedAndResultMosquitto(t *testing.T) {
	t.Parallel()
	url := os.Getenv("LEASEPOOL_TEST_MQTT_URL")
	if url == "" {
		t.Fatal("LEASEPOOL_TEST_MQTT_URL is empty: start the test servers first (tests/servers up) so that it points at Mosquitto")
	}
	testCore(t, setup(t, setupOpts{url: url, sim: device.Config{Latency: 50 * time.Millisecond}}))
}

func TestDeviceFailureFailsAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{FailRate: 1}})
	err := e.handler.Handle(ctxT(t, 20*time.Second), job("fail-1", 1, Command{Device: e.dev(0), Command: "x"}))
	if !errors.Is(err, ErrDeviceFailed) || !strings.Contains(err.Error(), "simulated failure") {
		t.Fatalf("Handle = %v, want ErrDeviceFailed", err)
	}
}

func TestNoAckRepublishedThenFails(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	// Nobody answers for this device (it is not offline: never heard of).
	silent := e.prefix + "-silent"
	start := time.Now()
	err := e.handler.Handle(ctxT(t, 20*time.Second), job("noack-1", 1, Command{Device: silent, Command: "x",
		AckTimeout: task.Duration(150 * time.Millisecond), MaxPublishes: 3}))
	if !errors.Is(err, ErrNoAck) {
		t.Fatalf("Handle = %v, want ErrNoAck", err)
	}
	if n := e.fault.Published(Topics{Prefix: e.prefix}.Device(silent, TopicCmd)); n != 3 {
		t.Fatalf("published %d times, want 3", n)
	}
	if el := time.Since(start); el < 450*time.Millisecond {
		t.Fatalf("gave up after %s, before 3 ack timeouts", el)
	}
}

func TestDroppedAcksDeviceRunsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{DropAckRate: 1, Latency: 2 * time.Second}})
	err := e.handler.Handle(ctxT(t, 20*time.Second), job("drop-1", 1, Command{Device: e.dev(0), Command: "x",
		AckTimeout: task.Duration(100 * time.Millisecond), MaxPublishes: 4}))
	if !errors.Is(err, ErrNoAck) {
		t.Fatalf("Handle = %v, want ErrNoAck", err)
	}
	testutil.Eventually(t, 10*time.Second, "the run to end", func() bool { return len(e.sim.Report().Runs) == 1 })
	r := e.sim.Report()
	if tot := r.Totals(); tot.Ran != 1 || tot.Duplicates != 3 || tot.DroppedAcks != 4 || len(r.Overlaps) != 0 {
		t.Fatalf("report: %+v overlaps %v", tot, r.Overlaps)
	}
}

func TestLostAckResultStillCounts(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{DropAckRate: 1}})
	// Latency zero: the result arrives although no ack ever does.
	err := e.handler.Handle(ctxT(t, 20*time.Second), job("lostack-1", 1, Command{Device: e.dev(0), Command: "x",
		AckTimeout: task.Duration(5 * time.Second)}))
	if err != nil {
		t.Fatalf("Handle = %v, want nil", err)
	}
}

// TestOfflineDeviceIsHeld: a command for a device known offline is held
// before its claim (Ready: no, until the device's next status change or
// the recheck), and one claimed anyway is given back at once, nothing
// sent.
func TestOfflineDeviceIsHeld(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	e.sim.Device(0).GoOffline(time.Hour)
	testutil.Eventually(t, 10*time.Second, "the will to arrive", func() bool { return e.handler.Tracker().Offline(e.dev(0)) })
	off := job("off-1", 1, Command{Device: e.dev(0), Command: "x"})
	hold, ready := e.handler.Ready(off.Task)
	if ready || hold.Wake == nil || hold.Recheck != 3*time.Second {
		t.Fatalf("Ready = %+v, %v; want held with a wake and the 3 s recheck", hold, ready)
	}
	if _, ready := e.handler.Ready(job("new-1", 1, Command{Device: "never-heard-of", Command: "x"}).Task); !ready {
		t.Fatal("a command for a device never heard of is held; its session would queue it")
	}
	err := e.handler.Handle(ctxT(t, 5*time.Second), off)
	var sn *consumer.SnoozeError
	if !errors.As(err, &sn) || sn.Delay != offlineSnooze {
		t.Fatalf("Handle = %v, want Snooze(%s)", err, offlineSnooze)
	}
	if n := e.fault.Published(Topics{Prefix: e.prefix}.Device(e.dev(0), TopicCmd)); n != 0 {
		t.Fatalf("published %d commands to an offline device", n)
	}
}

// TestReadyReadsFlowStepsAndLetsTakeoversThrough: a flow step's command
// is judged by what is inside its envelope (held while its device is
// offline), and a command with a running attempt is let through, so that
// a claim takes over its dead holder's lease or records its failure.
func TestReadyReadsFlowStepsAndLetsTakeoversThrough(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	e.sim.Device(0).GoOffline(time.Hour)
	testutil.Eventually(t, 10*time.Second, "the will to arrive", func() bool { return e.handler.Tracker().Offline(e.dev(0)) })
	cmd := job("x", 1, Command{Device: e.dev(0), Command: "x"}).Task.Payload
	ref := flow.StepRef{Flow: "f", Gen: 1, Step: 0, Name: "update"}
	env, _ := json.Marshal(map[string]any{"flow": ref, "params": map[string]any{}, "payload": json.RawMessage(cmd)})
	step := &task.Task{Key: ref.TaskKey(), Kind: Kind, Payload: env}
	if _, ready := e.handler.Ready(step); ready {
		t.Fatal("a flow step's command for an offline device is let through; want held")
	}
	forged := &task.Task{Key: "not-the-step", Kind: Kind, Payload: env}
	if _, ready := e.handler.Ready(forged); !ready {
		t.Fatal("an envelope under another key is read as a flow step")
	}
	taken := &task.Task{Key: "t-1", Kind: Kind, Payload: cmd,
		Attempts: []task.Attempt{{WorkerID: "dead", Attempt: 1, State: task.AttemptRunning, LeaseUntil: time.Now().Add(-time.Second)}}}
	if _, ready := e.handler.Ready(taken); !ready {
		t.Fatal("a command with a running attempt is held; want it let through for the takeover")
	}
}

// TestOfflineTimeout: a command whose device stays away longer than its
// offline_timeout (from the task's publish) fails instead of snoozing.
func TestOfflineTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	e.sim.Device(0).GoOffline(time.Hour)
	testutil.Eventually(t, 10*time.Second, "the will to arrive", func() bool { return e.handler.Tracker().Offline(e.dev(0)) })
	c := Command{Device: e.dev(0), Command: "x", OfflineTimeout: task.Duration(time.Minute)}
	fresh := job("off-3", 1, c)
	fresh.Task.CreatedAt = time.Now()
	var sn *consumer.SnoozeError
	if err := e.handler.Handle(ctxT(t, 5*time.Second), fresh); !errors.As(err, &sn) {
		t.Fatalf("Handle within offline_timeout = %v, want a snooze", err)
	}
	if hold, ready := e.handler.Ready(fresh.Task); ready || hold.Recheck > 3*time.Second {
		t.Fatalf("Ready within offline_timeout = %+v, %v; want held", hold, ready)
	}
	near := job("off-5", 1, c)
	near.Task.CreatedAt = time.Now().Add(-time.Minute + time.Second)
	if hold, ready := e.handler.Ready(near.Task); ready || hold.Recheck > time.Second {
		t.Fatalf("Ready a second before offline_timeout = %+v, %v; want held at most that second", hold, ready)
	}
	old := job("off-4", 1, c)
	old.Task.CreatedAt = time.Now().Add(-2 * time.Minute)
	if _, ready := e.handler.Ready(old.Task); !ready {
		t.Fatal("Ready past offline_timeout holds the command; want it let through to fail")
	}
	err := e.handler.Handle(ctxT(t, 5*time.Second), old)
	if err == nil || errors.As(err, &sn) || !strings.Contains(err.Error(), "offline_timeout") {
		t.Fatalf("Handle past offline_timeout = %v, want a failure naming offline_timeout", err)
	}
}

func TestOfflineBeforeAckSnoozes(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{DropAckRate: 1, Latency: time.Hour}})
	done := make(chan error, 1)
	go func() {
		done <- e.handler.Handle(ctxT(t, 20*time.Second), job("off-2", 1, Command{Device: e.dev(0), Command: "x",
			AckTimeout: task.Duration(time.Second), ResultTimeout: task.Duration(2 * time.Second)}))
	}()
	testutil.Eventually(t, 10*time.Second, "the command to run", func() bool { _, ok := e.sim.Device(0).Running(); return ok })
	e.sim.Device(0).GoOffline(time.Hour)
	var sn *consumer.SnoozeError
	if err := <-done; !errors.As(err, &sn) {
		t.Fatalf("Handle = %v, want a snooze", err)
	}
}

func TestStaleAttemptRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	ctx := ctxT(t, 20*time.Second)
	c := Command{Device: e.dev(0), Command: "x"}
	if err := e.handler.Handle(ctx, job("stale-1", 2, c)); err != nil {
		t.Fatalf("attempt 2: %v", err)
	}
	err := e.handler.Handle(ctx, job("stale-1", 1, c))
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "stale attempt 1 < 2") {
		t.Fatalf("attempt 1 = %v, want refused as stale", err)
	}
	r := e.sim.Report()
	if len(r.StaleAttempts) != 1 || r.StaleAttempts[0].Attempt != 1 || r.StaleAttempts[0].Highest != 2 || len(r.Runs) != 1 {
		t.Fatalf("report: stale %+v runs %+v", r.StaleAttempts, r.Runs)
	}
}

func TestLeaseLostReturnsPromptly(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{Latency: time.Hour}})
	ctx, cancel := context.WithCancelCause(context.Background())
	lost := errors.New("lease lost in test")
	done := make(chan error, 1)
	go func() { done <- e.handler.Handle(ctx, job("lease-1", 1, Command{Device: e.dev(0), Command: "x"})) }()
	testutil.Eventually(t, 10*time.Second, "the command to run", func() bool { _, ok := e.sim.Device(0).Running(); return ok })
	cancel(lost)
	select {
	case err := <-done:
		if !errors.Is(err, lost) {
			t.Fatalf("Handle = %v, want the cancel cause", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Handle did not return within 2s of losing its lease")
	}
}

func TestOverlapFlagged(t *testing.T) {
	t.Parallel()
	// Two commands for one device at once (as if the lock were broken):
	// the simulator flags the second.
	e := setup(t, setupOpts{sim: device.Config{Latency: 300 * time.Millisecond}})
	ctx := ctxT(t, 20*time.Second)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			errs <- e.handler.Handle(ctx, job(fmt.Sprintf("ov-%d", i), 1, Command{Device: e.dev(0), Command: "x"}))
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r := e.sim.Report()
	if len(r.Overlaps) != 1 || len(r.Runs) != 2 || r.Runs[0].End.After(r.Runs[1].Start) {
		t.Fatalf("overlaps %+v runs %+v", r.Overlaps, r.Runs)
	}
}

func TestBrokerRestartMidCommand(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{Latency: 1500 * time.Millisecond}})
	done := make(chan error, 1)
	go func() {
		done <- e.handler.Handle(ctxT(t, 30*time.Second), job("restart-1", 1, Command{Device: e.dev(0), Command: "x"}))
	}()
	testutil.Eventually(t, 10*time.Second, "the command to run", func() bool { _, ok := e.sim.Device(0).Running(); return ok })
	addr := e.broker.Addr()
	_ = e.broker.Close()
	b2, err := broker.Listen(context.Background(), broker.Config{Addr: addr, Anonymous: true})
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = b2.Close() })
	if err := <-done; err != nil {
		t.Fatalf("Handle across a broker restart: %v", err)
	}
	if r := e.sim.Report(); len(r.Runs) != 1 || len(r.Overlaps) != 0 {
		t.Fatalf("runs %+v overlaps %+v", r.Runs, r.Overlaps)
	}
}

func TestRepliesForOtherAttemptsIgnored(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	// A fake device on the broker's inline client: it answers every
	// command first for the wrong attempt, then with a wrong correlation
	// id, then properly.
	topics := Topics{Prefix: e.prefix}
	fake := e.prefix + "-fake"
	cmds := make(chan CommandMessage, 4)
	if err := e.broker.Server().Subscribe(topics.Device(fake, TopicCmd), 1, inlineHandler(func(b []byte) {
		if c, err := DecodeCommand(b); err == nil {
			cmds <- c
		}
	})); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- e.handler.Handle(ctxT(t, 20*time.Second), job("other-1", 5, Command{Device: fake, Command: "x",
			AckTimeout: task.Duration(10 * time.Second), ResultTimeout: task.Duration(10 * time.Second)}))
	}()
	c := <-cmds
	pub := func(kind string, r Reply) {
		b, _ := Encode(r)
		if err := e.broker.Server().Publish(topics.Device(fake, kind), b, false, 1); err != nil {
			t.Error(err)
		}
	}
	pub(TopicAck, Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: 4, OK: false, Error: "old"})
	pub(TopicAck, Reply{CorrelationID: "other", TaskKey: c.TaskKey, Attempt: 5, OK: false, Error: "other"})
	pub(TopicAck, Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: 5, OK: true})
	pub(TopicResult, Reply{CorrelationID: c.CorrelationID, TaskKey: "someone-else", Attempt: 5, OK: false, Error: "wrong task"})
	pub(TopicResult, Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: 5, OK: true})
	if err := <-done; err != nil {
		t.Fatalf("Handle = %v, want the reply of its own attempt", err)
	}
}

// TestInjectedDisconnectMidCommand: the handler's own connection drops
// while the device runs the command (the fault transport takes it down
// for a while). The command still succeeds, the device runs it once, and
// exactly two copies go out: the first, and the one asked again after the
// reconnect (a duplicate the device answers from its cache).
func TestInjectedDisconnectMidCommand(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{Latency: 1500 * time.Millisecond}})
	ctx := ctxT(t, 30*time.Second)
	done := make(chan error, 1)
	go func() { done <- e.handler.Handle(ctx, job("disc-1", 1, Command{Device: e.dev(0), Command: "x"})) }()
	testutil.Eventually(t, 10*time.Second, "the command to run", func() bool { _, ok := e.sim.Device(0).Running(); return ok })
	if err := e.fault.InjectDisconnect(ctx, 200*time.Millisecond); err != nil {
		t.Fatalf("inject disconnect: %v", err)
	}
	if !e.fault.Connected() {
		t.Fatal("not connected again after the injected disconnect")
	}
	if err := <-done; err != nil {
		t.Fatalf("Handle across an injected disconnect = %v, want success", err)
	}
	if n := e.fault.Published(Topics{Prefix: e.prefix}.Device(e.dev(0), TopicCmd)); n != 2 {
		t.Fatalf("published %d copies, want 2 (the first and one after the reconnect)", n)
	}
	if r := e.sim.Report(); len(r.Runs) != 1 || !r.Runs[0].OK || len(r.Overlaps) != 0 {
		t.Fatalf("runs %+v overlaps %+v, want one successful run", r.Runs, r.Overlaps)
	}
}

func TestResultTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{sim: device.Config{Latency: time.Hour}})
	err := e.handler.Handle(ctxT(t, 20*time.Second), job("rt-1", 1, Command{Device: e.dev(0), Command: "x",
		ResultTimeout: task.Duration(200 * time.Millisecond)}))
	if !errors.Is(err, ErrResultTimeout) {
		t.Fatalf("Handle = %v, want ErrResultTimeout", err)
	}
}

func TestHandlerConfigErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  HandlerConfig
		want string
	}{
		"no url": {HandlerConfig{}, "broker_url"},
		"scheme": {HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "http://x:1"}}, "scheme"},
		"prefix": {HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "tcp://x:1"}, Prefix: "a/b"}, "prefix"},
		"cert":   {HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "tcp://x:1", CertFile: "c"}}, "key_file"},
		"retry":  {HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "tcp://x:1"}, OfflineRecheck: -1}, "offline_recheck"},
	} {
		if _, err := NewHandler(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, tc.want)
		}
	}
	h, err := NewHandler(HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "tcp://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Handle(context.Background(), job("k", 1, Command{Device: "d", Command: "x"})); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Handle before Start = %v", err)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestFleetUnderFaults drives three faulty devices the way the consumer
// would (one command per device at a time, a new attempt after each
// failure or snooze) and checks every command finally succeeds with no
// device ever running two at once.
func TestFleetUnderFaults(t *testing.T) {
	t.Parallel()
	const outage = 300 * time.Millisecond
	e := setup(t, setupOpts{sim: device.Config{Count: 3, Latency: 20 * time.Millisecond, FailRate: 0.2,
		OfflineRate: 0.15, OfflineFor: outage, DropAckRate: 0.2, Seed: 7}})
	ctx := ctxT(t, 60*time.Second)
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			for n := range 8 {
				key := fmt.Sprintf("fleet-%d-%d", i, n)
				ok := false
				for attempt := 1; attempt <= 40 && !ok; attempt++ {
					err := e.handler.Handle(ctx, job(key, attempt, Command{Device: e.dev(i), Command: "x",
						AckTimeout: task.Duration(300 * time.Millisecond), ResultTimeout: task.Duration(3 * time.Second)}))
					var sn *consumer.SnoozeError
					switch {
					case err == nil:
						ok = true
					case errors.As(err, &sn):
						// wait for the device to come back, as the snooze
						// would: its outage ends when it says, and the
						// device is online again soon after
						changed := e.handler.Tracker().Changed(e.dev(i))
						if e.handler.Tracker().Offline(e.dev(i)) {
							waitStart := time.Now()
							select {
							case <-changed:
								if waited := time.Since(waitStart); waited > outage+2*time.Second {
									t.Errorf("%s: device %s back %s after the handler saw it offline, want within its %s outage + 2s", key, e.dev(i), waited.Round(time.Millisecond), outage)
								}
							case <-ctx.Done():
							}
						}
					case ctx.Err() != nil:
						errs <- err
						return
					}
				}
				if !ok {
					errs <- fmt.Errorf("%s never succeeded", key)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r := e.sim.Report()
	var sb strings.Builder
	_ = r.WriteSummary(&sb)
	t.Log("\n" + sb.String())
	if len(r.Overlaps) != 0 {
		t.Fatalf("overlaps: %+v", r.Overlaps)
	}
}

// TestStaleRetainedStatusIgnored: a retained "online" (the copy a new
// subscription starts with) that arrives after the device's live "offline"
// (its will, published while the worker subscribed) is older: the device
// stays offline. After a reconnect the retained copies count again.
func TestStaleRetainedStatusIgnored(t *testing.T) {
	t.Parallel()
	h, err := NewHandler(HandlerConfig{ClientConfig: ClientConfig{BrokerURL: "tcp://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	topic := h.topics.Device("d", TopicStatus)
	status := func(online bool) []byte {
		b, _ := json.Marshal(Status{Online: online, At: time.Now()})
		return b
	}
	h.onMessage(Message{Topic: topic, Payload: status(false)})
	h.onMessage(Message{Topic: topic, Payload: status(true), Retained: true})
	if !h.Tracker().Offline("d") {
		t.Fatal("a stale retained online overrode the live offline")
	}
	h.onConnecting()
	h.onMessage(Message{Topic: topic, Payload: status(true), Retained: true})
	if h.Tracker().Offline("d") {
		t.Fatal("after a reconnect the retained online was ignored")
	}
}
