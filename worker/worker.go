// Package worker is what `leasepool worker` runs, as one library type: a
// consumer with the built-in kinds (exec only when asked, under its
// guard), your own handlers, device tasks over MQTT, flows, schedules,
// retention, metrics and the worker registry, started and stopped
// together.
//
// A program of your own builds a consumer.Mux with its handlers and hands
// it over:
//
//	mux := consumer.NewMux()
//	mux.RegisterFunc("resize", resize)
//	w, err := worker.New(worker.Config{Store: st, Mux: mux})
//	...
//	err = w.Start(ctx)
//	...
//	err = w.Stop(ctx)
//
// or, as a program's main, err = w.Run(ctx), which stops when ctx ends.
// Config.Check refuses a bad setting before anything is opened.
//
// The workers sharing a store elect one (Elected): it runs the cluster's
// duties, the schedule runner, the flow reconciler, the rollout driver,
// retention and (on MongoDB) the trigger runner, and samples the queue
// for the dashboard's charts. One lease, ElectionKey, decides it;
// another worker is elected within ElectionLease after the elected one
// dies or freezes, and within a second after it stops. Hosting the
// embedded MQTT broker is a lease of its own
// (docs/decisions/0015-one-elector-and-a-broker-lease.md).
//
// Stop order: the consumer first (running handlers finish within
// ShutdownTimeout, then their leases are released), then the elector
// (the duties stop, then the lease is released), then the MQTT client and
// the embedded broker (handlers may be talking to devices until the
// consumer has stopped). The Store is the caller's: Stop leaves it open.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/trigger"
)

// Config is what a Worker runs. Zero values take the documented defaults.
type Config struct {
	// Store is where tasks are claimed and every shared state lives.
	// Required; the Worker does not close it.
	Store task.Store

	// Mux holds the handlers of your own kinds. The built-in kinds named in
	// Kinds and the flow middleware are added to it. Nil: a new Mux.
	Mux *consumer.Mux

	// ID names this worker in leases, pins and the registry. Default
	// "<host>-<pid>-<random>". A second process under a live ID refuses to
	// start (task.ErrWorkerIDTaken). Ids under task.ReservedPrefix are
	// leasepool's own (flows a store kept as tasks, before flows were
	// documents, are pinned to one so that no worker runs them) and
	// refused.
	ID string

	// Kinds are the kinds this worker claims. A built-in kind named here
	// is registered on Mux: "noop", "sleep", "exec" (configured by Exec)
	// and "device" (configured by Devices). Every other kind must have a
	// handler on Mux. Default: builtin.DefaultKinds ("noop", "sleep") and
	// every kind registered on Mux. Exec runs a program of the
	// publisher's choosing, so it runs only when named here.
	Kinds []string

	// Concurrency is how many handlers run at once. Default 8.
	Concurrency int

	// RetryPolicy says how long a failed task waits before any worker may
	// claim it again. Default consumer.ExponentialBackoff(time.Second,
	// 5*time.Minute).
	RetryPolicy consumer.RetryPolicy

	// ShutdownTimeout is how long Stop lets running handlers finish before
	// they are cancelled and their leases released. Default
	// task.DefaultWorkerTimeout.
	ShutdownTimeout time.Duration

	// Exec configures the exec kind when Kinds names it: its guard, its
	// allow-list of programs and the environment programs get (see
	// builtin.ExecConfig).
	Exec builtin.ExecConfig

	// Devices configures device tasks when Kinds names "device".
	Devices Devices

	// RetentionEvery is how often the elected worker deletes old finished
	// tasks (retention.Runner). Default
	// retention.DefaultEvery; at least schedule.MinEvery.
	RetentionEvery time.Duration

	// Metrics, when not nil, counts claims, outcomes, handler durations
	// and device commands. Serving it (metrics.Handler) is the caller's.
	Metrics *metrics.Metrics

	// StoreFailTimeout, when positive, is how long the store may keep
	// failing (the registry unreadable, this worker's registration not
	// renewed, an embedded store's file deleted while open) before Failed
	// reports it. A worker in that state runs nothing; its supervisor
	// should start it afresh. Zero: never reported.
	StoreFailTimeout time.Duration

	// StoreFile is the embedded store's file as the store was opened with
	// it (relative to the working directory, through symbolic links), for
	// StoreFailTimeout's check that it was not deleted while open; "" for
	// other stores.
	StoreFile string

	// Logger gets every component's logs. Default slog.Default().
	Logger *slog.Logger
}

// Devices is how device tasks reach their MQTT broker (see
// mqttdev.WireConfig).
type Devices struct {
	// Client says how to reach the broker. An empty BrokerURL means the
	// embedded broker at EmbeddedBroker, hosted by one of the workers
	// sharing the store at a time.
	Client mqttdev.ClientConfig
	// EmbeddedBroker is the embedded broker's loopback address. Default
	// mqttdev.DefaultEmbeddedBroker.
	EmbeddedBroker string
	// EmbeddedBrokerLease is the broker's hosting lease: another worker
	// takes it over within about this long after its host dies. Default
	// broker.DefaultLease.
	EmbeddedBrokerLease time.Duration
	// EmbeddedBrokerAnonymous lets every client into the embedded broker
	// when this worker hosts it, with every right: for a lab only. By
	// default it checks the device credentials and the worker secret in
	// the store.
	EmbeddedBrokerAnonymous bool
	// Prefix is the first MQTT topic level. Default mqttdev.DefaultPrefix.
	Prefix string
	// BrokerLogger gets the embedded broker's own logs. Default: Logger.
	// The broker logs every client that drops as a warning: a logger at
	// error level keeps what matters.
	BrokerLogger *slog.Logger
}

// Worker is a running `leasepool worker`: New, then Start once and Stop.
type Worker struct {
	cfg      Config
	kinds    []string
	consumer *consumer.Consumer
	stats    *stats.Recorder
	life     lifecycle.Runner
	failed   chan error

	// Started by Start, stopped by Stop in reverse order.
	wiring *mqttdev.Wiring
	// elector once started, for Elected from any goroutine.
	elector atomic.Pointer[singleton.Elector]
}

// The election of the worker that runs the cluster's duties.
const (
	// ElectionKey is the lease's key in the store's lock table (namespace
	// task.LockSingleton).
	ElectionKey = "leasepool.leader"
	// ElectionLease is how long the lease lasts unrenewed: another worker
	// is elected within about this long after the elected one dies or
	// freezes. Short, since the schedule runner must publish within
	// schedule.DefaultLate of a slot and a rollout must not stall.
	ElectionLease = 3 * time.Second
	// ElectionRenew is how often the elected worker renews the lease, and
	// how often the others look whether it still does: a worker that
	// stops gives the lease up, and another is elected within this long.
	ElectionRenew = time.Second
)

// ErrStoreFailing is what Failed reports when the store kept failing for
// longer than Config.StoreFailTimeout.
var ErrStoreFailing = errors.New("store failing")

// New checks cfg (see Check; errors are *ConfigError) and registers the
// handlers Kinds names on the Mux. It opens nothing: Start does.
func New(cfg Config) (*Worker, error) {
	if cfg.Store == nil {
		return nil, &ConfigError{"Store", "required"}
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Mux == nil {
		cfg.Mux = consumer.NewMux()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	kinds := slices.Clone(cfg.Kinds)
	if len(kinds) == 0 {
		kinds = append(slices.Clone(builtin.DefaultKinds), cfg.Mux.Kinds()...)
	}
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)
	if !slices.Contains(kinds, "exec") && (len(cfg.Exec.Allow) > 0 || len(cfg.Exec.PassEnv) > 0) {
		cfg.Logger.Warn("exec's allowed programs and passed environment have no effect: this worker does not run exec", slog.Any("kinds", kinds))
	}
	registered := cfg.Mux.Kinds()
	for _, k := range kinds {
		switch {
		case slices.Contains(registered, k):
			// Your own handler, or a built-in one registered already.
		case k == "noop" || k == "sleep":
			builtin.Register(cfg.Mux)
			registered = cfg.Mux.Kinds()
		case k == "exec":
			if err := builtin.RegisterExec(cfg.Mux, cfg.Exec); err != nil {
				return nil, fmt.Errorf("worker: Exec: %w", err)
			}
		case k == mqttdev.Kind:
			// Registered by mqttdev.Wire at Start, once the worker id is
			// known to be this process's.
		default:
			return nil, &ConfigError{"Kinds", fmt.Sprintf("%q has no handler on Mux", k)}
		}
	}
	if err := flow.Register(cfg.Mux, flow.Config{Store: cfg.Store, Logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	var observer consumer.Observer // a nil *metrics.Metrics would not be a nil Observer
	if cfg.Metrics != nil {
		observer = cfg.Metrics
	}
	w := &Worker{cfg: cfg, kinds: kinds, failed: make(chan error, 1)}
	// The dashboard's charts: outcomes by kind per minute, kept in the
	// store; the elected worker samples the queue for them.
	rec, err := stats.NewRecorder(stats.RecorderConfig{Store: cfg.Store, Logger: cfg.Logger, Samples: w.Elected})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	observer = stats.Tee(observer, rec)
	c, err := consumer.New(consumer.Config{
		Store: cfg.Store, Handler: cfg.Mux, WorkerID: cfg.ID,
		// Every worker fires flow timers (sleep steps, signal timeouts),
		// whatever kinds it was told to run.
		Kinds:       append(slices.Clone(kinds), flow.TimerKind),
		Concurrency: cfg.Concurrency, ShutdownTimeout: cfg.ShutdownTimeout, RetryPolicy: cfg.RetryPolicy,
		Logger: cfg.Logger, Observer: observer,
		Reaped: func(ctx context.Context, t *task.Task) {
			if err := flow.TaskFinished(ctx, cfg.Store, t, cfg.Logger); err != nil {
				cfg.Logger.Warn("flow of a failed task not moved on; the reconciler will", slog.String("task", t.Key), slog.Any("error", err))
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w.consumer, w.stats = c, rec
	return w, nil
}

// Elected reports whether this worker is the one the workers sharing its
// store elected, now: the holder of the lease on ElectionKey (one worker
// at a time, another within ElectionLease after it dies), which runs the
// schedule runner, the flow reconciler, the rollout driver and retention,
// samples the queue for the dashboard's charts and, in `leasepool worker
// --metrics-addr`, reads the store's gauges, so that these cost the store
// once per cluster rather than once per worker.
func (w *Worker) Elected() bool {
	e := w.elector.Load()
	return e != nil && e.Elected()
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.consumer.WorkerID() }

// Kinds are the kinds the worker claims, sorted.
func (w *Worker) Kinds() []string { return slices.Clone(w.kinds) }

// Consumer is the worker's consumer, for its Stats.
func (w *Worker) Consumer() *consumer.Consumer { return w.consumer }

// Start registers the worker id, then starts device tasks, the consumer
// and the elector (the worker stands for election; elected, it runs the
// schedule runner, the flow reconciler, the rollout driver and
// retention). ctx bounds the start only. When it fails, what it started
// is stopped again.
func (w *Worker) Start(ctx context.Context) error {
	run, err := w.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := w.start(ctx, run); err != nil {
		_ = w.Stop(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

func (w *Worker) start(ctx, run context.Context) error {
	cfg := w.cfg
	// The worker id first: a second process under a live id must stop
	// before it touches anything named after it (its MQTT client id would
	// take over the live worker's session).
	if err := w.consumer.Register(ctx); err != nil {
		return err
	}
	if slices.Contains(w.kinds, mqttdev.Kind) {
		d := cfg.Devices
		if d.BrokerLogger == nil {
			d.BrokerLogger = cfg.Logger
		}
		wc := mqttdev.WireConfig{
			Mux: cfg.Mux, Store: cfg.Store, WorkerID: w.ID(), Client: d.Client,
			EmbeddedBroker: d.EmbeddedBroker, EmbeddedBrokerLease: d.EmbeddedBrokerLease,
			EmbeddedBrokerAnonymous: d.EmbeddedBrokerAnonymous, Prefix: d.Prefix,
			Logger: cfg.Logger, BrokerLogger: d.BrokerLogger,
		}
		if cfg.Metrics != nil {
			wc.Observer = cfg.Metrics
		}
		wiring, err := mqttdev.Wire(ctx, wc)
		if err != nil {
			return fmt.Errorf("device tasks: %w", err)
		}
		w.wiring = wiring
	}
	// The consumer ends its handlers when its start context ends: only
	// Stop may end them, after ShutdownTimeout.
	if err := w.consumer.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	w.stats.Start()
	elector, err := w.newElector()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.elector.Store(elector) // for Stop, should Start fail
	if err := elector.Start(ctx); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if cfg.StoreFailTimeout > 0 {
		p := storeProbe{s: cfg.Store, workerID: w.ID(), instance: w.consumer.Instance(), file: procPath(cfg.StoreFile),
			registration: w.consumer.Registration}
		w.life.Go(func() { watchStore(run, p, cfg.StoreFailTimeout, w.failed) })
	}
	return nil
}

// newElector returns the worker's elector with the cluster's duties
// registered on it, not started.
func (w *Worker) newElector() (*singleton.Elector, error) {
	cfg := w.cfg
	e, err := singleton.NewElector(singleton.ElectorConfig{Store: cfg.Store, Key: ElectionKey, HolderID: w.ID(),
		Lease: ElectionLease, Renew: ElectionRenew, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	sched, err := schedule.NewRunner(schedule.RunnerConfig{Store: cfg.Store, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	rec, err := flow.NewReconciler(flow.ReconcilerConfig{Store: cfg.Store, WorkerID: w.ID(), Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	drv, err := rollout.NewDriver(rollout.DriverConfig{Store: cfg.Store, WorkerID: w.ID(), Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	retain, err := retention.NewRunner(retention.RunnerConfig{Config: retention.Config{Store: cfg.Store, Logger: cfg.Logger},
		WorkerID: w.ID(), Every: cfg.RetentionEvery})
	if err != nil {
		return nil, err
	}
	duties := []singleton.Duty{
		{Name: "schedule runner", Run: sched.Duty},
		{Name: "flow reconciler", Run: rec.Duty},
		{Name: "rollout driver", Run: drv.Duty},
		{Name: "retention", Run: retain.Duty},
	}
	// Triggers watch the user's collections (MongoDB) or publish what the
	// SQL triggers on the user's tables recorded (the embedded store):
	// only a store that has either runs them.
	_, tables := cfg.Store.(task.TableTriggerStore)
	if _, ok := cfg.Store.(task.CollectionWatcher); ok || tables {
		trig, err := trigger.NewRunner(trigger.RunnerConfig{Store: cfg.Store, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		duties = append(duties, singleton.Duty{Name: "trigger runner", Run: trig.Duty})
	}
	for _, d := range duties {
		if err := e.Register(d); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Failed reports, once, that the store kept failing for longer than
// Config.StoreFailTimeout (an error wrapping ErrStoreFailing). The worker
// keeps running: stop it, and let its supervisor start a new one.
func (w *Worker) Failed() <-chan error { return w.failed }

// Stop stops the consumer (running handlers finish within
// ShutdownTimeout, then their leases are released), then the elector (the
// duties stop, and the lease is released so another worker is elected at
// once), then device tasks. It
// returns the consumer's error, or ctx's cause when ctx ends first.
func (w *Worker) Stop(ctx context.Context) error {
	var err error
	stopErr := w.life.Stop(ctx, func() {
		err = w.consumer.Stop(ctx)
		bg := context.WithoutCancel(ctx)
		if serr := w.stats.Stop(bg); serr != nil { // the charts' last counts
			w.cfg.Logger.Warn("worker: chart counts not written", "err", serr)
		}
		if e := w.elector.Load(); e != nil {
			_ = e.Stop(bg)
		}
		if w.wiring != nil {
			_ = w.wiring.Stop(bg)
		}
	})
	if stopErr != nil {
		return stopErr
	}
	return err
}
