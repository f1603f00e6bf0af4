package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestRolloutAndLabelCommands(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("device", "label", "pump-1", "model=pump-x", "site=berlin")
	c.must("device", "label", "pump-2", "model=pump-x", "site=paris")
	out := c.must("device", "label", "pump-2", "site-", "ring=canary")
	if !strings.Contains(out, "labels model=pump-x,ring=canary") {
		t.Fatalf("label output %q", out)
	}
	out = c.must("devices", "--select", "model=pump-x,ring!=canary")
	if !strings.Contains(out, "pump-1") || strings.Contains(out, "pump-2") || !strings.Contains(out, "site=berlin") {
		t.Fatalf("devices --select:\n%s", out)
	}
	c.must("device", "approve", "pump-1", "pump-2")
	c.must("rollout", "create", "fw-2", "--command", "update", "--args", `{"version":"2.0"}`, "--select", "model=pump-x",
		"--waves", "1,100%", "--approve-waves", "--rate", "20/1m", "--abort-when", "failed>10% after 20; any>50%",
		"--retries", "2", "--retry-on", "timed_out,offline", "--rollback-command", "update", "--rollback-args", `{"version":"1.0"}`)
	var p rollout.Progress
	if err := json.Unmarshal([]byte(c.must("rollout", "show", "fw-2", "--json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.State != rollout.StateRunning || p.Total.Total != 2 || len(p.Waves) != 2 || p.Waves[1].Gate != rollout.GateApproval ||
		p.Spec.Rate.N != 20 || len(p.Spec.AbortWhen) != 2 || p.Spec.Retries != 2 || p.AbortAt != 10 {
		t.Fatalf("progress %+v", p)
	}
	if out := c.must("rollout", "pause", "fw-2"); !strings.Contains(out, "paused") {
		t.Fatalf("pause: %q", out)
	}
	if _, err := c.run("rollout", "approve", "fw-2"); err != nil {
		t.Fatalf("approve ahead of the gate: %v", err)
	}
	c.must("rollout", "resume", "fw-2")
	c.must("rollout", "cancel", "fw-2")
	if _, err := c.run("rollout", "resume", "fw-2"); !errors.Is(err, rollout.ErrState) || exitStatus(err) != exitFailed {
		t.Fatalf("resume a cancelled rollout: %v", err)
	}
	if out := c.must("rollout", "ls"); !strings.Contains(out, "fw-2") || !strings.Contains(out, "cancelling") {
		t.Fatalf("ls:\n%s", out)
	}
	if out := c.must("rollout", "show", "fw-2", "--devices"); !strings.Contains(out, "pump-1") || !strings.Contains(out, "rollout.created") {
		t.Fatalf("show:\n%s", out)
	}
	if _, err := c.run("rollout", "show", "nope"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("show missing: %v", err)
	}
}

func TestRolloutBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("device", "label", "d1", "model=x")
	before := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	create := func(extra ...string) []string {
		return append([]string{"rollout", "create", "r1", "--command", "update", "--devices", "d1"}, extra...)
	}
	for _, tc := range []struct {
		args  []string
		names string
	}{
		{[]string{"rollout", "create", "../x", "--command", "u", "--devices", "d1"}, "name"},
		{[]string{"rollout", "create", "a:b", "--command", "u", "--devices", "d1"}, "name"},
		{[]string{"rollout", "create", "r1", "--command", "u"}, "select"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--devices", "d1", "--select", "model=x"}, "select"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--select", "model"}, "select"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--select", "model=a b"}, "select"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--select", "attr:model=x"}, "select"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--devices", "d1,,d2"}, "--devices"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--devices", "a/#"}, "devices"},
		{create("--args", "[1]"), "args"},
		{create("--args", "{"), "args"},
		{create("--waves", "50%,10%,100%"), "--waves"},
		{create("--waves", "10,5,100%"), "--waves"},
		{[]string{"rollout", "create", "r1", "--command", "u", "--devices", "d1,d2,d3", "--waves", "2,10%,100%"}, "waves"},
		{create("--waves", "1,50%"), "--waves"},
		{create("--rate", "0/1s"), "--rate"},
		{create("--rate", "fast"), "--rate"},
		{create("--abort-when", "failed>10"), "--abort-when"},
		{create("--abort-when", "failed>10% after -1"), "--abort-when"},
		{create("--abort-when", "succeeded>1%"), "--abort-when"},
		{create("--retries", "11"), "retries"},
		{create("--retry-on", "cancelled"), "--retry-on"},
		{create("--timeout", "0s"), "--timeout"},
		{create("--rollback-args", "{}"), "rollback_args"},
		{create("--gate-failures", "101"), "gate_failures"},
		{[]string{"device", "label", "d1"}, "ID"},
		{[]string{"device", "label", "d1", "bad key=v"}, "label"},
		{[]string{"device", "label", "d1", "k=v w"}, "label"},
		{[]string{"device", "label", "a/#", "k=v"}, "device"},
		{[]string{"devices", "--select", "k"}, "--select"},
		{[]string{"devices", "--select", "attribute:k=v"}, "--select"},
		{[]string{"device", "approve"}, "ID"},
		{[]string{"device", "forget"}, "ID"},
		{[]string{"device", "forget", "d1", "a/#"}, "device"},
		{[]string{"device", "approve", "a/#"}, "device"},
		{[]string{"device", "approve", "d1", "--by", ""}, "--by"},
		{[]string{"device", "approve", "d1", "--by", "a\tb"}, "--by"},
		{[]string{"device", "approve", "--select", "attr:k=v"}, "--select"},
		{[]string{"device", "approve", "--select", "k"}, "--select"},
		{[]string{"device", "approve", "d1", "--select", "k=v"}, "select"},
		{[]string{"rollout", "pause", "a/b"}, "name"},
		{[]string{"rollout", "delete", "a/b"}, "name"},
		{[]string{"rollout", "delete"}, "NAME"},
	} {
		_, err := c.run(tc.args...)
		if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), tc.names) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v (exit %d), want a one-line bad input error naming %s", tc.args, err, exitStatus(err), tc.names)
		}
	}
	after := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	for name, b := range before {
		if strings.HasSuffix(name, ".db") && after[name] != b {
			t.Errorf("%s changed by refused commands", name)
		}
	}
	if _, err := os.Stat(c.path); err != nil {
		t.Fatal(err)
	}
}

// driveUntil opens c's store and runs a rollout driver's passes until
// rollout name is in state want.
func driveUntil(t *testing.T, c *harness, name string, want rollout.State) {
	t.Helper()
	st, err := sqlitestore.Open(t.Context(), c.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d, err := rollout.NewDriver(rollout.DriverConfig{Store: st, WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := d.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
		r, err := rollout.Get(t.Context(), st, name)
		if err != nil {
			t.Fatal(err)
		}
		if r.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout %s still %s, want %s", name, r.State, want)
		}
	}
}

// `rollout delete` refuses a running rollout in one line naming what to
// do, and leaves it; once cancelled, deletes it. A rollout with the
// largest args, all '<>&', goes through it all.
func TestRolloutDeleteCommand(t *testing.T) {
	t.Parallel()
	c := setup(t)
	args := `{"a":"` + strings.Repeat("<>&", (rollout.MaxArgsLen-8)/3) + `"}`
	c.must("rollout", "create", "fw", "--command", "update", "--devices", "d1,d2", "--args", args,
		"--rollback-command", "update", "--rollback-args", args)
	before := c.must("rollout", "show", "fw", "--json")
	_, err := c.run("rollout", "delete", "fw")
	if !errors.Is(err, rollout.ErrState) || exitStatus(err) != exitFailed || !strings.Contains(err.Error(), "cancel it first") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("delete of a running rollout: %v (exit %d)", err, exitStatus(err))
	}
	if after := c.must("rollout", "show", "fw", "--json"); after != before {
		t.Fatal("a refused delete changed the rollout")
	}
	c.must("rollout", "cancel", "fw")
	driveUntil(t, c, "fw", rollout.StateCancelled)
	if out := c.must("rollout", "delete", "fw"); !strings.Contains(out, "rollout fw deleted (it was cancelled)") {
		t.Fatalf("delete: %q", out)
	}
	for _, args := range [][]string{{"rollout", "show", "fw"}, {"rollout", "delete", "fw"}} {
		if _, err := c.run(args...); !errors.Is(err, task.ErrNotFound) {
			t.Fatalf("%v after delete: %v", args, err)
		}
	}
	if out := c.must("rollout", "ls"); strings.Contains(out, "fw") {
		t.Fatalf("ls after delete:\n%s", out)
	}
}

// A task published under a key of a rollout not yet created: `rollout
// create` refuses the name in one line naming the task, writes nothing.
func TestRolloutCreateOverASquattedKey(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "rollout:sq1:d2:1", "--kind", "device", "--payload", `{"device":"d2","command":"update","args":{"version":"evil-0.0"}}`)
	_, err := c.run("rollout", "create", "sq1", "--command", "update", "--args", `{"version":"2.0"}`, "--devices", "d1,d2")
	if !errors.Is(err, rollout.ErrExists) || exitStatus(err) == 0 || !strings.Contains(err.Error(), "rollout:sq1:d2:1") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("create over a squatted key: %v (exit %d)", err, exitStatus(err))
	}
	if _, err := c.run("rollout", "show", "sq1"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("show after the refused create: %v", err)
	}
}

// `rollout create --dry-run` prints each wave's devices and writes
// nothing; --json prints the plan.
func TestRolloutCreateDryRun(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, id := range []string{"p1", "p2", "p3", "p4"} {
		c.must("device", "label", id, "model=pump-x")
		c.must("device", "approve", id)
	}
	before := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	out := c.must("rollout", "create", "fw", "--command", "update", "--select", "model=pump-x", "--waves", "1,50%,100%", "--approve-waves", "--dry-run")
	want := "rollout fw (dry run, nothing written): update to 4 devices in 3 waves\n" +
		"wave 1: target 1 (1), gate auto, 1 devices: p1\n" +
		"wave 2: target 50% (2), gate approval, 1 devices: p2\n" +
		"wave 3: target 100% (4), gate approval, 2 devices: p3,p4\n"
	if out != want {
		t.Fatalf("dry run printed\n%s\nwant\n%s", out, want)
	}
	var p rollout.Plan
	if err := json.Unmarshal([]byte(c.must("rollout", "create", "fw", "--command", "update", "--devices", "p4,p1", "--dry-run", "--json")), &p); err != nil ||
		len(p.Waves) != 1 || strings.Join(p.Waves[0].Devices, ",") != "p1,p4" {
		t.Fatalf("dry run --json: %+v %v", p, err)
	}
	if _, err := c.run("rollout", "create", "fw", "--command", "update", "--devices", "p1", "--waves", "3,2,100%", "--dry-run"); exitStatus(err) != exitBadInput {
		t.Fatalf("dry run of bad waves: %v", err)
	}
	after := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	for name, b := range before {
		if strings.HasSuffix(name, ".db") && after[name] != b {
			t.Errorf("%s changed by a dry run", name)
		}
	}
	if _, err := c.run("rollout", "show", "fw"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("show after dry runs: %v", err)
	}
}

func driveAborting(t *testing.T, path, name string) {
	t.Helper()
	ctx := t.Context()
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mux := consumer.NewMux()
	mux.RegisterFunc(mqttdev.Kind, func(context.Context, *consumer.Job) error {
		return fmt.Errorf("%w: simulated", mqttdev.ErrDeviceFailed)
	})
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "fleet", Logger: slog.New(slog.DiscardHandler),
		RetryPolicy: consumer.NoBackoff})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	stepper := rollout.NewStepper(s)
	// A step each check, as a driver does.
	testutil.Eventually(t, 30*time.Second, "rollout "+name+" to end", func() bool {
		if err := stepper.Step(ctx, name); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		r, err := rollout.Get(ctx, s, name)
		if err != nil {
			t.Fatal(err)
		}
		return r.State.Final()
	})
}

func TestRolloutShowAfterAbort(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("rollout", "create", "bad", "--command", "update", "--devices", "d1,d2,d3,d4",
		"--waves", "2,3,100%", "--abort-when", "failed>50% after 1")
	driveAborting(t, c.path, "bad")
	var states []string
	out := c.must("rollout", "show", "bad")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == "auto" {
			states = append(states, f[5])
		}
	}
	if fmt.Sprint(states) != "[aborted skipped skipped]" || !strings.HasPrefix(out, "rollout bad: aborted") {
		t.Errorf("wave states %v, want [aborted skipped skipped]:\n%s", states, out)
	}
	var p rollout.Progress
	if err := json.Unmarshal([]byte(c.must("rollout", "show", "bad", "--json")), &p); err != nil {
		t.Fatal(err)
	}
	if w := p.Waves; w[0].State != rollout.WaveAborted || !w[0].EndedAt.Equal(p.EndedAt) || p.EndedAt.IsZero() ||
		w[1].State != rollout.WaveSkipped || w[1].Started || !w[1].EndedAt.IsZero() {
		t.Errorf("show --json waves %+v, ended %s", w, p.EndedAt)
	}
}
