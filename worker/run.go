// run.go: checking a Config before anything is opened, and running a
// Worker the way a program's main does.

package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// ConfigError is a Config field that Check or New refuses. It wraps
// task.ErrInvalid.
type ConfigError struct {
	// Field is the field's path in Config: "Kinds", "Exec.Allow".
	Field string
	// Reason says what is wrong with its value.
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("worker: %s: %s: %s", task.ErrInvalid, e.Field, e.Reason)
}

func (e *ConfigError) Unwrap() error { return task.ErrInvalid }

// Check refuses what New would refuse in cfg but the Store, which it does
// not need: a program checks its settings before it opens anything. Its
// errors are *ConfigError.
func (cfg Config) Check() error {
	switch {
	case cfg.Concurrency < 0:
		return &ConfigError{"Concurrency", fmt.Sprintf("must not be negative, got %d", cfg.Concurrency)}
	case cfg.ShutdownTimeout < 0:
		return &ConfigError{"ShutdownTimeout", fmt.Sprintf("must not be negative, got %s", cfg.ShutdownTimeout)}
	case cfg.StoreFailTimeout < 0:
		return &ConfigError{"StoreFailTimeout", fmt.Sprintf("must not be negative, got %s", cfg.StoreFailTimeout)}
	case cfg.RetentionEvery != 0 && cfg.RetentionEvery < schedule.MinEvery:
		return &ConfigError{"RetentionEvery", fmt.Sprintf("must be at least %s, got %s", schedule.MinEvery, cfg.RetentionEvery)}
	}
	if cfg.ID != "" {
		if err := task.ValidateKey("ID", cfg.ID); err != nil {
			return &ConfigError{"ID", strings.TrimPrefix(err.Error(), task.ErrInvalid.Error()+": ID: ")}
		}
	}
	known := append(slices.Clone(builtin.Kinds), mqttdev.Kind)
	if cfg.Mux != nil {
		known = append(known, cfg.Mux.Kinds()...)
	}
	for _, k := range cfg.Kinds {
		if !slices.Contains(known, k) {
			return &ConfigError{"Kinds", fmt.Sprintf("%q has no handler on Mux (built in: %s)",
				k, strings.Join(append(slices.Clone(builtin.Kinds), mqttdev.Kind), ", "))}
		}
	}
	if slices.Contains(cfg.Kinds, "exec") {
		return checkExec(cfg.Exec)
	}
	return nil
}

// checkExec checks each field of the exec kind's configuration on its own,
// so that the error names the field.
func checkExec(e builtin.ExecConfig) error {
	for _, n := range e.PassEnv {
		if strings.ContainsAny(n, " \t\n") {
			return &ConfigError{"Exec.PassEnv", fmt.Sprintf("%q is not a variable name", n)}
		}
	}
	for _, f := range []struct {
		name string
		cfg  builtin.ExecConfig
	}{
		{"KillGrace", builtin.ExecConfig{KillGrace: e.KillGrace}},
		{"Allow", builtin.ExecConfig{Allow: e.Allow}},
		{"PassEnv", builtin.ExecConfig{PassEnv: e.PassEnv}},
		{"GuardPath", builtin.ExecConfig{GuardPath: e.GuardPath}},
	} {
		if _, err := builtin.NewExec(f.cfg); err != nil {
			reason := strings.TrimPrefix(err.Error(), "builtin.ExecConfig: ")
			return &ConfigError{"Exec." + f.name, strings.TrimPrefix(reason, f.name+": ")}
		}
	}
	return nil
}

// Run starts the worker, runs it until ctx ends and then stops it, the
// way a program's main runs one. When the store keeps failing past
// Config.StoreFailTimeout it stops the worker and returns Failed's error
// (wrapping ErrStoreFailing): the program should exit, and its supervisor
// start it afresh.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		w.cfg.Logger.Info("shutting down: finishing running tasks",
			slog.Duration("timeout", cmp.Or(w.cfg.ShutdownTimeout, task.DefaultWorkerTimeout)))
		return w.Stop(context.WithoutCancel(ctx))
	case err := <-w.Failed():
		w.cfg.Logger.Error("store failing: stopping the worker so that its supervisor starts it afresh", slog.Any("err", err))
		_ = w.Stop(context.WithoutCancel(ctx))
		return err
	}
}
