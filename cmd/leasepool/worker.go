package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/task"
)

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "claim and run tasks until SIGINT or SIGTERM",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "worker id (default host-pid-random)"},
			&cli.StringFlag{Name: "kinds", Usage: "comma-separated kinds to run: exec, noop, sleep, device (default every one but exec, " +
				"which runs any program a publisher names: a worker runs exec only when --kinds names it)"},
			&cli.StringFlag{Name: "exec-allow", EnvVars: []string{"LEASEPOOL_EXEC_ALLOW"},
				Usage: "comma-separated path patterns (path.Match, absolute: /usr/local/bin/*) of the only programs exec may run, " +
					"matched against argv[0] looked up in the program's PATH; any other is refused and never started (default any program)"},
			&cli.StringFlag{Name: "exec-env", EnvVars: []string{"LEASEPOOL_EXEC_ENV"},
				Usage: "comma-separated names of the worker's environment variables passed to exec programs besides " +
					"PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ, TMPDIR, TERM and SHELL (no others are, none of leasepool's secrets)"},
			&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "handlers running at once"},
			&cli.StringFlag{Name: "mqtt", EnvVars: []string{"LEASEPOOL_MQTT_URL"},
				Usage: "MQTT broker for device tasks (tcp://, ssl://); empty: use the embedded broker at --embedded-broker, starting it if no other worker has"},
			&cli.StringFlag{Name: "embedded-broker", Value: mqttdev.DefaultEmbeddedBroker, Usage: "loopback address of the embedded MQTT broker"},
			&cli.DurationFlag{Name: "embedded-broker-lease", Value: broker.DefaultLease,
				Usage: "hosting lease of the embedded broker: when its host dies, another worker on the host takes it over within about this long"},
			&cli.StringFlag{Name: "mqtt-user", EnvVars: []string{"LEASEPOOL_MQTT_USER"}, Usage: "MQTT user name"},
			&cli.StringFlag{Name: "mqtt-password", EnvVars: []string{"LEASEPOOL_MQTT_PASSWORD"}, Usage: "MQTT password"},
			&cli.StringFlag{Name: "mqtt-ca", Usage: "CA certificate (PEM) that signs the broker's"},
			&cli.StringFlag{Name: "mqtt-cert", Usage: "client certificate (PEM)"},
			&cli.StringFlag{Name: "mqtt-key", Usage: "client key (PEM)"},
			&cli.StringFlag{Name: "prefix", Value: mqttdev.DefaultPrefix, Usage: "first MQTT topic level"},
			&cli.DurationFlag{Name: "backoff", Value: time.Second,
				Usage: "delay before a failed task is tried again, doubling with each failure up to 5m (jittered ±25%); 0 retries at once"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: task.DefaultWorkerTimeout,
				Usage: "on SIGINT/SIGTERM, how long running handlers may finish before they are cancelled and their leases released; " +
					"longer lets more tasks finish, but a stopped worker then hands its tasks over later than a crashed one would (after worker_timeout)"},
			&cli.DurationFlag{Name: "kill-grace", Value: builtin.DefaultKillGrace,
				Usage: "on shutdown, how long an exec program has between SIGTERM and SIGKILL (lease loss and cancel kill at once)"},
			&cli.DurationFlag{Name: "store-fail-timeout", Value: defaultStoreFailTimeout,
				Usage: "how long the store may keep failing (this worker cannot read its registry or its registration is not renewed) " +
					"before the worker exits with status 1, so that its supervisor starts it afresh; 0: never exit"},
			retentionEveryFlag(),
		}, metricsFlags()...),
		Action: runWorker,
	}
}

// runWorker runs the worker command until its context ends.
func runWorker(c *cli.Context) error {
	kinds, err := workerKinds(c)
	if err != nil {
		return err
	}
	mux := consumer.NewMux()
	builtin.Register(mux)
	if err := registerExec(c, mux, kinds); err != nil {
		return err
	}
	s, err := openStore(c, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if kinds, err = addMaintenance(c, mux, s, kinds); err != nil {
		return err
	}
	obs, stopMetrics, err := startWorkerMetrics(c, s)
	if err != nil {
		return err
	}
	defer stopMetrics()
	var observer consumer.Observer // a nil *metrics.Metrics would not be a nil Observer
	if obs != nil {
		observer = obs
	}
	w, err := consumer.New(consumer.Config{
		Store: s, Handler: mux, WorkerID: c.String("id"), Kinds: kinds,
		Concurrency: c.Int("concurrency"), ShutdownTimeout: c.Duration("shutdown-timeout"),
		RetryPolicy: consumer.ExponentialBackoff(c.Duration("backoff"), 5*time.Minute),
		Logger:      slog.Default(), Observer: observer,
	})
	if err != nil {
		return err
	}
	// The worker id first: a second process under a live id must
	// stop before it touches anything named after it (its MQTT
	// client id would take over the live worker's session).
	if err := w.Register(c.Context); err != nil {
		return err
	}
	// Shutdown order: the consumer stops first (its handlers may be
	// talking to devices), then the MQTT client, then the broker.
	if slices.Contains(kinds, mqttdev.Kind) {
		warnSecretFlag(c, "mqtt", "LEASEPOOL_MQTT_URL", true)
		warnSecretFlag(c, "mqtt-password", "LEASEPOOL_MQTT_PASSWORD", false)
		wc := deviceWiring(c, mux, s, w.WorkerID())
		if obs != nil {
			wc.Observer = obs
		}
		wiring, err := mqttdev.Wire(c.Context, wc)
		if err != nil {
			return fmt.Errorf("device tasks: %w", err)
		}
		defer wiring.Stop(context.Background())
	}
	if err := w.Start(context.WithoutCancel(c.Context)); err != nil {
		return err
	}
	stopBackground, err := startBackground(c, s, w.WorkerID())
	if err != nil {
		return err
	}
	defer stopBackground()
	storeFailed := watchStore(c.Context, storeProbe{s: s, workerID: w.WorkerID(), instance: w.Instance(), file: embeddedStoreFile(c.String("store"))},
		c.Duration("store-fail-timeout"))
	select {
	case <-c.Context.Done(): // SIGINT or SIGTERM
	case err := <-storeFailed:
		slog.Error("store failing: stopping the worker so that its supervisor starts it afresh", slog.Any("err", err))
		ctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
		defer cancel()
		_ = w.Stop(ctx)
		return err
	}
	slog.Info("shutting down: finishing running tasks", slog.Duration("timeout", c.Duration("shutdown-timeout")))
	return w.Stop(context.Background())
}

// defaultStoreFailTimeout is --store-fail-timeout's default: past a
// MongoDB election or a short network outage, well before anyone waits
// on a worker that runs nothing.
const defaultStoreFailTimeout = 30 * time.Second

// ErrStoreFailing is returned by a worker whose store kept failing past
// --store-fail-timeout.
var ErrStoreFailing = errors.New("store failing")

// watchStore checks the store every so often and sends one error once it
// has kept failing for longer than bound: reading the worker registry
// fails, or this worker's registration (instance) is not there or has
// lapsed, so the heartbeat cannot write. A worker in that state runs
// nothing and logs warnings for ever; a new process opens the store
// afresh (an embedded store whose -wal file was deleted works again
// then). bound 0: never.
func watchStore(ctx context.Context, p storeProbe, bound time.Duration) <-chan error {
	out := make(chan error, 1)
	if bound <= 0 {
		return out
	}
	every := min(max(bound/10, 100*time.Millisecond), 5*time.Second)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		var since time.Time // when the store was first seen failing; zero: healthy
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := p.check(ctx, min(bound, 10*time.Second))
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			case time.Since(since) > bound:
				out <- fmt.Errorf("%w for %s (--store-fail-timeout %s): %w", ErrStoreFailing,
					time.Since(since).Round(time.Second), bound, err)
				return
			}
		}
	}()
	return out
}

// storeProbe is what watchStore checks.
type storeProbe struct {
	s                  task.Store
	workerID, instance string
	// file is the embedded store's file, absolute with its directory's
	// symbolic links resolved; "" for other stores.
	file string
}

// check reads the registry and checks this worker's registration is live,
// and that none of an embedded store's files this process holds open was
// deleted or replaced: its writes then reach no other process, though
// they succeed.
func (p storeProbe) check(ctx context.Context, timeout time.Duration) error {
	if name := deletedOpenFile(p.file); name != "" {
		return fmt.Errorf("the embedded store's file %s was deleted or replaced while open", name)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ws, err := p.s.Workers(ctx)
	if err != nil {
		return fmt.Errorf("read the worker registry: %w", err)
	}
	now := p.s.Now()
	for _, w := range ws {
		if w.ID == p.workerID && w.Instance == p.instance {
			if !w.Live(now) {
				return fmt.Errorf("registration of worker %s not renewed since %s", p.workerID, w.Heartbeat.Format(time.RFC3339))
			}
			return nil
		}
	}
	return fmt.Errorf("worker %s (instance %s) is not in the registry", p.workerID, p.instance)
}

// embeddedStoreFile is the file of a sqlite: store URL as /proc shows it,
// "" for other URLs.
func embeddedStoreFile(url string) string {
	path, ok := strings.CutPrefix(url, "sqlite:")
	if !ok {
		return ""
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return ""
	}
	return filepath.Join(dir, filepath.Base(abs))
}

// deletedOpenFile returns the name of a file of the embedded store at
// file (itself, its -wal, -shm or -lock) that this process holds open
// although it was deleted, as Linux's /proc/self/fd tells; "" if none or
// where there is no /proc.
func deletedOpenFile(file string) string {
	if file == "" {
		return ""
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return ""
	}
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil {
			continue
		}
		name, deleted := strings.CutSuffix(target, " (deleted)")
		if !deleted {
			continue
		}
		if rest, ok := strings.CutPrefix(name, file); ok && slices.Contains([]string{"", "-wal", "-shm", "-lock"}, rest) {
			return name
		}
	}
	return ""
}

// registerExec registers exec on mux when kinds names it, with the
// --exec-allow list and the --exec-env names.
func registerExec(c *cli.Context, mux *consumer.Mux, kinds []string) error {
	allow, err := listFlag(c, "exec-allow")
	if err != nil {
		return err
	}
	passEnv, err := listFlag(c, "exec-env")
	if err != nil {
		return err
	}
	if !slices.Contains(kinds, "exec") {
		for _, f := range []string{"exec-allow", "exec-env"} {
			if c.IsSet(f) {
				slog.Warn("--"+f+" has no effect: this worker does not run exec (add it to --kinds)", slog.Any("kinds", kinds))
			}
		}
		return nil
	}
	for _, p := range allow {
		if !strings.HasPrefix(p, "/") {
			return badFlag(c, "exec-allow", "%q is not an absolute path pattern (want /DIR/NAME, /DIR/*)", p)
		}
		if _, err := path.Match(p, "/"); err != nil {
			return badFlag(c, "exec-allow", "%q: %v", p, err)
		}
	}
	for _, n := range passEnv {
		if strings.ContainsAny(n, "= ") {
			return badFlag(c, "exec-env", "%q is not a variable name", n)
		}
	}
	// Exec programs run under a guard: this binary (see main).
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("exec guard: %w", err)
	}
	return builtin.RegisterExec(mux, builtin.ExecConfig{
		GuardPath: self, KillGrace: c.Duration("kill-grace"), Allow: allow, PassEnv: passEnv,
	})
}

// workerKinds checks the worker flags before anything is opened and
// returns the kinds to run.
func workerKinds(c *cli.Context) ([]string, error) {
	if c.Int("concurrency") < 1 {
		return nil, fmt.Errorf("--concurrency: must be at least 1, got %d", c.Int("concurrency"))
	}
	if _, err := positiveDuration(c, "shutdown-timeout"); err != nil {
		return nil, err
	}
	if c.Duration("backoff") < 0 {
		return nil, fmt.Errorf("--backoff: must not be negative, got %s", c.Duration("backoff"))
	}
	if _, err := positiveDuration(c, "kill-grace"); err != nil {
		return nil, err
	}
	if c.Duration("store-fail-timeout") < 0 {
		return nil, fmt.Errorf("--store-fail-timeout: must not be negative, got %s", c.Duration("store-fail-timeout"))
	}
	known := append(slices.Clone(builtin.Kinds), mqttdev.Kind)
	kinds, err := listFlag(c, "kinds")
	if err != nil {
		return nil, err
	}
	for _, k := range kinds {
		if !slices.Contains(known, k) {
			return nil, fmt.Errorf("--kinds: %q is not a kind this worker can run (%v)", k, known)
		}
	}
	if len(kinds) == 0 {
		kinds = append(slices.Clone(builtin.DefaultKinds), mqttdev.Kind)
	}
	if c.String("id") != "" {
		if err := task.ValidateName("--id", c.String("id")); err != nil {
			return nil, err
		}
	}
	return kinds, nil
}

// minLevel passes on records at or above its level only.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}

// startBackground starts what every worker runs beside its consumer, with
// no leader: the schedule runner (it publishes the schedules' due slots)
// and the flow reconciler (the one holding its lease works).
func startBackground(c *cli.Context, s task.Store, workerID string) (stop func(), err error) {
	stopSchedules, err := startScheduleRunner(c, s)
	if err != nil {
		return nil, err
	}
	rec, err := flow.NewReconciler(flow.ReconcilerConfig{Store: s, WorkerID: workerID, Logger: slog.Default()})
	if err == nil {
		err = rec.Start(c.Context)
	}
	if err != nil {
		stopSchedules()
		return nil, err
	}
	return func() {
		_ = rec.Stop(context.Background())
		stopSchedules()
	}, nil
}
