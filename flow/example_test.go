package flow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// dbSteps is the database-instance flow: check resources, initialise the
// instance, deduct resources; their rollbacks raise an alert, clean the
// half-made instance and restore the resources.
func dbSteps() []flow.Step {
	one := 1
	return []flow.Step{
		{Name: "check", Action: flow.Action{Kind: "db.check", Retries: &one},
			Rollback: &flow.Action{Kind: "db.alert"}},
		{Name: "init", Action: flow.Action{Kind: "db.init", Timeout: task.Duration(10 * time.Second), Retries: &one},
			Rollback: &flow.Action{Kind: "db.clean", Retries: &one}},
		{Name: "deduct", Action: flow.Action{Kind: "db.deduct", Retries: &one},
			Rollback: &flow.Action{Kind: "db.restore"}},
	}
}

// request is what the example's handlers read from the shared parameters.
type request struct {
	Name     string `json:"name"`
	CPU      int    `json:"cpu"`
	Fail     string `json:"fail"`      // a step that fails (tests)
	FailUndo string `json:"fail_undo"` // a rollback that fails (tests)
}

func readRequest(ctx context.Context) request {
	var r request
	p := flow.Params(ctx)
	for k, dst := range map[string]any{"name": &r.Name, "cpu": &r.CPU, "fail": &r.Fail, "fail_undo": &r.FailUndo} {
		if raw, ok := p[k]; ok {
			_ = json.Unmarshal(raw, dst)
		}
	}
	return r
}

// dbHandlers registers the example's handlers; say receives one line per
// run.
func dbHandlers(mux *consumer.Mux, say func(string)) {
	step := func(kind string, run func(ctx context.Context, job *consumer.Job, r request) error) {
		mux.RegisterFunc(kind, func(ctx context.Context, job *consumer.Job) error {
			ref, _ := flow.CurrentStep(ctx)
			r := readRequest(ctx)
			say(fmt.Sprintf("%s %s", ref.Flow, kind))
			if (!ref.Undo && r.Fail == ref.Name) || (ref.Undo && r.FailUndo == ref.Name) {
				return errors.New(kind + ": injected failure")
			}
			return run(ctx, job, r)
		})
	}
	step("db.check", func(ctx context.Context, job *consumer.Job, r request) error {
		return job.SetResult(map[string]int{"free_cpu": 64 - r.CPU})
	})
	step("db.init", func(ctx context.Context, job *consumer.Job, r request) error {
		return job.SetResult(map[string]string{"instance": "inst-" + r.Name})
	})
	step("db.deduct", func(ctx context.Context, job *consumer.Job, r request) error {
		var init struct{ Instance string }
		if err := json.Unmarshal(flow.Params(ctx)["init"], &init); err != nil || init.Instance == "" {
			return fmt.Errorf("deduct: no instance from step init: %v", err)
		}
		return nil
	})
	for _, k := range []string{"db.alert", "db.clean", "db.restore"} {
		step(k, func(context.Context, *consumer.Job, request) error { return nil })
	}
}

// waitFinished polls until the flow has stopped.
func waitFinished(ctx context.Context, s task.Store, key string) (*flow.Flow, error) {
	for {
		f, err := flow.Get(ctx, s, key)
		if err != nil {
			return nil, err
		}
		if f.State.Finished() {
			return f, nil
		}
		select {
		case <-ctx.Done():
			return f, fmt.Errorf("flow %s still %s: %w", key, f.State, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The database-instance flow: a worker runs each step as an ordinary task;
// steps read the request's parameters and earlier steps' results. The
// second request fails at "init", so "init" and "check" are rolled back,
// in reverse.
func Example() {
	dir, _ := os.MkdirTemp("", "leasepool-flow")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "tasks.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	mux := consumer.NewMux()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))
	if err := flow.Register(mux, flow.Config{Store: store, Logger: quiet}); err != nil {
		log.Fatal(err)
	}
	dbHandlers(mux, func(s string) { fmt.Println(s) })
	w, err := consumer.New(consumer.Config{Store: store, Handler: mux, WorkerID: "example", Logger: quiet,
		RetryPolicy: consumer.NoBackoff})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer w.Stop(ctx)

	for _, req := range []string{`{"name":"db-1","cpu":4}`, `{"name":"db-2","cpu":8,"fail":"init"}`} {
		var r request
		_ = json.Unmarshal([]byte(req), &r)
		if _, _, err := flow.Publish(ctx, store, flow.Spec{Key: r.Name, Params: json.RawMessage(req), Steps: dbSteps()}); err != nil {
			log.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		f, err := waitFinished(wctx, store, r.Name)
		cancel()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %s, check=%s init=%s\n", f.Key, f.State, f.Params["check"], f.Params["init"])
	}
	// Output:
	// db-1 db.check
	// db-1 db.init
	// db-1 db.deduct
	// db-1: succeeded, check={"free_cpu":60} init={"instance":"inst-db-1"}
	// db-2 db.check
	// db-2 db.init
	// db-2 db.init
	// db-2 db.clean
	// db-2 db.alert
	// db-2: failed, check={"free_cpu":56} init=
}
