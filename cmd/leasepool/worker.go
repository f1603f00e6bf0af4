package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
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
			&cli.DurationFlag{Name: "store-fail-timeout", Value: 30 * time.Second,
				Usage: "how long the store may keep failing (this worker cannot read its registry or its registration is not renewed) " +
					"before the worker exits with status 1, so that its supervisor starts it afresh; 0: never exit"},
			retentionEveryFlag(),
		}, metricsFlags()...),
		Action: runWorker,
	}
}

// runWorker runs the worker command until SIGINT or SIGTERM.
func runWorker(c *cli.Context) error {
	kinds, err := workerKinds(c)
	if err != nil {
		return err
	}
	exec, err := execConfig(c, kinds)
	if err != nil {
		return err
	}
	if slices.Contains(kinds, mqttdev.Kind) {
		warnSecretFlag(c, "mqtt", "LEASEPOOL_MQTT_URL", true)
		warnSecretFlag(c, "mqtt-password", "LEASEPOOL_MQTT_PASSWORD", false)
	}
	s, err := openStore(c, false)
	if err != nil {
		return err
	}
	defer s.Close()
	obs, stopMetrics, err := startWorkerMetrics(c, s)
	if err != nil {
		return err
	}
	defer stopMetrics()
	storeFile, _ := strings.CutPrefix(c.String("store"), "sqlite:")
	w, err := worker.New(worker.Config{
		Store: s, ID: c.String("id"), Kinds: kinds, Concurrency: c.Int("concurrency"),
		RetryPolicy:     consumer.ExponentialBackoff(c.Duration("backoff"), 5*time.Minute),
		ShutdownTimeout: c.Duration("shutdown-timeout"), Exec: exec, Devices: deviceConfig(c),
		RetentionEvery: c.Duration("retention-every"), Metrics: obs,
		StoreFailTimeout: c.Duration("store-fail-timeout"), StoreFile: storeFile,
	})
	if err != nil {
		return err
	}
	if err := w.Start(c.Context); err != nil {
		return err
	}
	select {
	case <-c.Context.Done(): // SIGINT or SIGTERM
		slog.Info("shutting down: finishing running tasks", slog.Duration("timeout", c.Duration("shutdown-timeout")))
		return w.Stop(context.Background())
	case err := <-w.Failed():
		slog.Error("store failing past --store-fail-timeout: stopping the worker so that its supervisor starts it afresh", slog.Any("err", err))
		_ = w.Stop(context.Background())
		return fmt.Errorf("--store-fail-timeout: %w", err)
	}
}

// execConfig maps the exec flags to builtin.ExecConfig, refusing bad ones
// before anything is opened.
func execConfig(c *cli.Context, kinds []string) (builtin.ExecConfig, error) {
	allow, err := listFlag(c, "exec-allow")
	if err != nil {
		return builtin.ExecConfig{}, err
	}
	passEnv, err := listFlag(c, "exec-env")
	if err != nil {
		return builtin.ExecConfig{}, err
	}
	if !slices.Contains(kinds, "exec") {
		for _, f := range []string{"exec-allow", "exec-env"} {
			if c.IsSet(f) {
				slog.Warn("--"+f+" has no effect: this worker does not run exec (add it to --kinds)", slog.Any("kinds", kinds))
			}
		}
		return builtin.ExecConfig{}, nil
	}
	for _, p := range allow {
		if !strings.HasPrefix(p, "/") {
			return builtin.ExecConfig{}, badFlag(c, "exec-allow", "%q is not an absolute path pattern (want /DIR/NAME, /DIR/*)", p)
		}
		if _, err := path.Match(p, "/"); err != nil {
			return builtin.ExecConfig{}, badFlag(c, "exec-allow", "%q: %v", p, err)
		}
	}
	for _, n := range passEnv {
		if strings.ContainsAny(n, "= ") {
			return builtin.ExecConfig{}, badFlag(c, "exec-env", "%q is not a variable name", n)
		}
	}
	// Exec programs run under a guard: this binary (see main).
	self, err := os.Executable()
	if err != nil {
		return builtin.ExecConfig{}, fmt.Errorf("exec guard: %w", err)
	}
	return builtin.ExecConfig{GuardPath: self, KillGrace: c.Duration("kill-grace"), Allow: allow, PassEnv: passEnv}, nil
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
		if err := task.ValidateKey("--id", c.String("id")); err != nil {
			return nil, err
		}
	}
	return kinds, nil
}
