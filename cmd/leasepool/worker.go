package main

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "claim and run tasks until SIGINT or SIGTERM",
		Flags: slices.Concat([]cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "worker id (default host-pid-random)"},
			&cli.StringFlag{Name: "kinds", Usage: "comma-separated kinds to run: exec, noop, sleep, device (default every one but exec, " +
				"which runs any program a publisher names: a worker runs exec only when --kinds names it)"},
		}, execFlags(), []cli.Flag{
			&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "handlers running at once"},
		}, deviceFlags(), []cli.Flag{
			&cli.DurationFlag{Name: "backoff", Value: time.Second,
				Usage: "delay before a failed task is tried again, doubling with each failure up to 5m (jittered ±25%); 0 retries at once"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: task.DefaultWorkerTimeout,
				Usage: "on SIGINT/SIGTERM, how long running handlers may finish before they are cancelled and their leases released; " +
					"longer lets more tasks finish, but a stopped worker then hands its tasks over later than a crashed one would (after worker_timeout)"},
			&cli.DurationFlag{Name: "store-fail-timeout", Value: 30 * time.Second,
				Usage: "how long the store may keep failing (this worker cannot read its registry or its registration is not renewed) " +
					"before the worker exits with status 1, so that its supervisor starts it afresh; 0: never exit"},
			retentionEveryFlag(),
		}, metricsFlags()),
		Action: runWorker,
	}
}

// runWorker runs the worker command until SIGINT or SIGTERM.
func runWorker(c *cli.Context) error {
	cfg, err := workerConfig(c)
	if err != nil {
		return err
	}
	if slices.Contains(cfg.Kinds, mqttdev.Kind) {
		warnSecretFlag(c, "mqtt", "LEASEPOOL_MQTT_URL", true)
		warnSecretFlag(c, "mqtt-password", "LEASEPOOL_MQTT_PASSWORD", false)
	}
	traffic := metrics.NewStoreTraffic()
	if cfg.Store, err = openStoreOptions(c, store.Options{Monitor: traffic.Monitor()}); err != nil {
		return err
	}
	defer cfg.Store.Close()
	// The metrics serve before the worker exists: its observer is the
	// worker's.
	var started atomic.Pointer[worker.Worker]
	elected := func() bool {
		w := started.Load()
		return w != nil && w.Elected()
	}
	var stopMetrics func()
	if cfg.Metrics, stopMetrics, err = startWorkerMetrics(c, cfg.Store, traffic, elected); err != nil {
		return err
	}
	defer stopMetrics()
	w, err := worker.New(cfg)
	if err != nil {
		return err
	}
	started.Store(w)
	if err := w.Run(c.Context); errors.Is(err, worker.ErrStoreFailing) {
		return fmt.Errorf("--store-fail-timeout: %w", err)
	} else {
		return err
	}
}

// workerFlags names the flag that sets each worker.Config field.
var workerFlags = map[string]string{"ID": "id", "Kinds": "kinds", "Concurrency": "concurrency", "ShutdownTimeout": "shutdown-timeout",
	"RetentionEvery": "retention-every", "StoreFailTimeout": "store-fail-timeout",
	"Exec.Allow": "exec-allow", "Exec.PassEnv": "exec-env", "Exec.KillGrace": "kill-grace"}

// workerConfig maps the flags to a worker.Config, refusing bad ones before
// anything is opened.
func workerConfig(c *cli.Context) (worker.Config, error) {
	if c.Int("concurrency") < 1 {
		return worker.Config{}, badFlag(c, "concurrency", "must be at least 1, got %d", c.Int("concurrency"))
	}
	if c.Duration("backoff") < 0 {
		return worker.Config{}, badFlag(c, "backoff", "must not be negative, got %s", c.Duration("backoff"))
	}
	if _, err := positiveDuration(c, "shutdown-timeout"); err != nil {
		return worker.Config{}, err
	}
	if _, err := storeGaugesWhen(c, nil); err != nil {
		return worker.Config{}, err
	}
	kinds, err := listFlag(c, "kinds")
	if err != nil {
		return worker.Config{}, err
	}
	if len(kinds) == 0 {
		kinds = append(slices.Clone(builtin.DefaultKinds), mqttdev.Kind)
	}
	exec, err := execConfig(c, kinds)
	if err != nil {
		return worker.Config{}, err
	}
	storeFile, _ := store.SQLiteFile(c.String("store"))
	cfg := worker.Config{ID: c.String("id"), Kinds: kinds, Concurrency: c.Int("concurrency"), Exec: exec,
		RetryPolicy:     consumer.ExponentialBackoff(c.Duration("backoff"), 5*time.Minute),
		ShutdownTimeout: c.Duration("shutdown-timeout"), Devices: deviceConfig(c), RetentionEvery: c.Duration("retention-every"),
		StoreFailTimeout: c.Duration("store-fail-timeout"), StoreFile: storeFile}
	var bad *worker.ConfigError
	if err := cfg.Check(); errors.As(err, &bad) && workerFlags[bad.Field] != "" {
		return worker.Config{}, badFlag(c, workerFlags[bad.Field], "%s", bad.Reason)
	} else if err != nil {
		return worker.Config{}, err
	}
	return cfg, nil
}
