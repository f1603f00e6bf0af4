package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
)

// TestMongoFlows runs the three cases of issue 12 on MongoDB (the shared
// wire test server): the flow document's compare-and-set, its payload
// rewritten on every move, and results round-tripping through BSON.
func TestMongoFlows(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	s := openMongoStore(t, ctx, sharedMongoDB(t), nil)
	var mu sync.Mutex
	var ran []string
	mux := consumer.NewMux()
	if err := flow.Register(mux, flow.Config{Store: s}); err != nil {
		t.Fatal(err)
	}
	mux.RegisterFunc("step", func(ctx context.Context, job *consumer.Job) error {
		ref, _ := flow.CurrentStep(ctx)
		mu.Lock()
		ran = append(ran, fmt.Sprintf("%s %s %v", ref.Flow, ref.Name, ref.Undo))
		mu.Unlock()
		var fail struct{ Do, Undo string }
		_ = json.Unmarshal(flow.Params(ctx)["fail"], &fail)
		if (!ref.Undo && fail.Do == ref.Name) || (ref.Undo && fail.Undo == ref.Name) {
			return errors.New("injected")
		}
		return job.SetResult(map[string]any{"step": ref.Step + 1, "seen": len(flow.Params(ctx))})
	})
	w, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "mongo-flows", RetryPolicy: consumer.NoBackoff})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(context.Background()) })

	zero := 0
	steps := []flow.Step{}
	for _, name := range []string{"check", "init", "deduct"} {
		steps = append(steps, flow.Step{Name: name, Action: flow.Action{Kind: "step", Retries: &zero},
			Rollback: &flow.Action{Kind: "step", Retries: &zero}})
	}
	cases := []struct {
		key, fail string
		want      flow.State
		runs      []string
	}{
		{"ok", `{}`, flow.StateSucceeded, []string{"check false", "init false", "deduct false"}},
		{"fails", `{"do":"init"}`, flow.StateFailed, []string{"check false", "init false", "init true", "check true"}},
		{"undo-fails", `{"do":"deduct","undo":"init"}`, flow.StateRollbackFailed,
			[]string{"check false", "init false", "deduct false", "deduct true", "init true"}},
	}
	for _, c := range cases {
		if _, _, err := flow.Publish(ctx, s, flow.Spec{Key: c.key, Params: json.RawMessage(`{"fail":` + c.fail + `}`), Steps: steps}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		var f *flow.Flow
		eventually(t, 2*time.Minute, "flow "+c.key+" to finish", func() bool {
			f, err = flow.Get(ctx, s, c.key)
			return err == nil && f.State.Finished()
		})
		if f.State != c.want {
			t.Errorf("%s: %s, want %s (%s)", c.key, f.State, c.want, f.Error)
		}
		var got []string
		mu.Lock()
		for _, r := range ran {
			if len(r) > len(c.key) && r[:len(c.key)+1] == c.key+" " {
				got = append(got, r[len(c.key)+1:])
			}
		}
		mu.Unlock()
		if !slices.Equal(got, c.runs) {
			t.Errorf("%s ran %v, want %v", c.key, got, c.runs)
		}
		if c.key == "ok" && string(f.Params["deduct"]) != `{"seen":3,"step":3}` {
			t.Errorf("ok: deduct's result %s", f.Params["deduct"])
		}
		if c.key == "undo-fails" && f.Events[len(f.Events)-1].Type != flow.EventRollbackFailed {
			t.Errorf("undo-fails: events %+v", f.Events)
		}
	}
	if _, err := s.GetDocument(ctx, flow.Namespace, "ok"); err != nil {
		t.Errorf("a finished flow's document: %v", err)
	}
}
