package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// runFlows runs the flows of keys in the store file path to their end on
// a worker whose kind "ok" succeeds and "bad" fails, then closes the
// store.
func runFlows(t *testing.T, path string, keys ...string) {
	t.Helper()
	ctx := t.Context()
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logs := &testutil.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s, Logger: log}); err != nil {
		t.Fatal(err)
	}
	mux.RegisterFunc("ok", func(context.Context, *consumer.Job) error { return nil })
	mux.RegisterFunc("bad", func(context.Context, *consumer.Job) error { return errors.New("broke") })
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w1", Logger: log, RetryPolicy: consumer.NoBackoff})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	deadline := time.Now().Add(time.Minute)
	for _, key := range keys {
		var f *flow.Flow
		if !testutil.Within(time.Until(deadline), func() bool {
			var err error
			if f, err = flow.Get(ctx, s, key); err != nil {
				t.Fatal(err)
			}
			return f.State.Finished()
		}) {
			t.Fatalf("flow %s still %s\n%s", key, f.State, logs)
		}
	}
}

// TestFlowShowSkippedAndLsAtTheFailure: a step that never started as a
// step it needs failed is skipped, with why, in flow show (its rows'
// state and the line under the table) and its --json; flow ls puts a
// failed flow at the step that failed, not where its rollback ended.
func TestFlowShowSkippedAndLsAtTheFailure(t *testing.T) {
	c := setup(t)
	c.must("flow", "publish", "chain", "--file", writeFile(t, `{"steps": [
  {"name": "a", "kind": "ok", "rollback": {"kind": "ok"}},
  {"name": "b", "kind": "bad", "retries": 0, "rollback": {"kind": "ok"}},
  {"name": "c", "kind": "ok"}, {"name": "d", "kind": "ok"}]}`))
	c.must("flow", "publish", "fleet", "--file", writeFile(t, `{"steps": [
  {"name": "u1", "kind": "bad", "retries": 0}, {"name": "u2", "kind": "ok"},
  {"name": "v1", "kind": "ok", "needs": ["u1"]}, {"name": "v2", "kind": "ok", "needs": ["u2"]},
  {"name": "all", "kind": "ok", "needs": ["v1", "v2"], "max_failed_needs": 1}]}`))
	runFlows(t, c.path, "chain", "fleet")

	rows := func(out string) map[string]string {
		m := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 3 {
				m[f[1]] = f[3]
			}
		}
		return m
	}
	out := c.must("flow", "show", "chain")
	if r := rows(out); r["b"] != "rolled_back" || r["c"] != "skipped" || r["d"] != "skipped" {
		t.Errorf("chain's step states %v:\n%s", r, out)
	}
	for _, want := range []string{"flow chain: failed, step 2/4 b failed, run 1", "b do error: broke\n",
		"c skipped: needs b, which failed\n", "d skipped: needs c, which was skipped\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	out = c.must("flow", "show", "fleet")
	if r := rows(out); r["u1"] != "failed" || r["v1"] != "skipped" || r["all"] != "succeeded" {
		t.Errorf("fleet's step states %v:\n%s", r, out)
	}
	if !strings.Contains(out, "v1 skipped: needs u1, which failed\n") || strings.Contains(out, "v1 do error") {
		t.Errorf("show does not say once why v1 was skipped:\n%s", out)
	}
	var f flow.Flow
	if err := json.Unmarshal([]byte(c.must("flow", "show", "fleet", "--json")), &f); err != nil {
		t.Fatal(err)
	}
	if v1 := f.Progress[2]; v1.State != flow.StepSkipped || v1.Reason != "needs u1, which failed" {
		t.Errorf("show --json: v1 is %s because %q; want skipped because u1 failed", v1.State, v1.Reason)
	}
	out = c.must("flow", "ls")
	if !strings.Contains(out, "chain  failed     step 2/4 b failed") {
		t.Errorf("ls does not put the failed flow at its failed step:\n%s", out)
	}
}
