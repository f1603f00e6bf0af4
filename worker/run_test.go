package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

// TestCheckNamesTheField: Check refuses, without a Store, what New would,
// with a *ConfigError naming the field as the Config spells it, so a
// program can name its own flag or setting; each field of Exec on its own.
func TestCheckNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   worker.Config
		field string
	}{
		{worker.Config{Concurrency: -1}, "Concurrency"},
		{worker.Config{ShutdownTimeout: -time.Second}, "ShutdownTimeout"},
		{worker.Config{StoreFailTimeout: -time.Second}, "StoreFailTimeout"},
		{worker.Config{RetentionEvery: time.Millisecond}, "RetentionEvery"},
		{worker.Config{ID: "a\nb"}, "ID"},
		{worker.Config{Kinds: []string{"noop", "resize"}}, "Kinds"},
		{worker.Config{Kinds: []string{"exec"}, Exec: builtin.ExecConfig{Allow: []string{"bin/*"}}}, "Exec.Allow"},
		{worker.Config{Kinds: []string{"exec"}, Exec: builtin.ExecConfig{Allow: []string{"/usr/[bin"}}}, "Exec.Allow"},
		{worker.Config{Kinds: []string{"exec"}, Exec: builtin.ExecConfig{PassEnv: []string{"A=B"}}}, "Exec.PassEnv"},
		{worker.Config{Kinds: []string{"exec"}, Exec: builtin.ExecConfig{PassEnv: []string{"A B"}}}, "Exec.PassEnv"},
		{worker.Config{Kinds: []string{"exec"}, Exec: builtin.ExecConfig{KillGrace: -time.Second}}, "Exec.KillGrace"},
		{worker.Config{Kinds: []string{"exec"}, Exec: builtin.ExecConfig{GuardPath: "/nonexistent/guard"}}, "Exec.GuardPath"},
	} {
		err := tc.cfg.Check()
		var ce *worker.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || ce.Reason == "" || !errors.Is(err, task.ErrInvalid) {
			t.Errorf("Check(%+v) = %v; want a *ConfigError naming %s, wrapping ErrInvalid", tc.cfg, err, tc.field)
		}
	}
	// Exec's settings are checked only where exec runs; the defaults pass.
	for _, cfg := range []worker.Config{{}, {Exec: builtin.ExecConfig{Allow: []string{"bin/*"}}}, {Kinds: []string{"noop", "device"}}} {
		if err := cfg.Check(); err != nil {
			t.Errorf("Check(%+v) = %v; want nil", cfg, err)
		}
	}
}

// TestRunStopsWhenContextEnds: Run starts the worker, runs tasks, and
// returns once its context ends, the worker stopped and its id free again.
func TestRunStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	w, err := worker.New(worker.Config{Store: st, ID: "runner", Kinds: []string{"noop"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if _, _, err := task.Publish(t.Context(), st, task.PublishParams{Key: "n", Kind: "noop"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "task n to succeed under Run", func() bool {
		doc, err := st.Get(t.Context(), "n")
		return err == nil && doc.State == task.StateSucceeded
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after its context ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// Stopped: a new worker under the same id starts.
	again, err := worker.New(worker.Config{Store: st, ID: "runner", Kinds: []string{"noop"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Start(t.Context()); err != nil {
		t.Fatalf("a worker under the id of one Run stopped: %v", err)
	}
	_ = again.Stop(context.Background())
}
