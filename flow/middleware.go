package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	Store  task.Store
	Logger *slog.Logger
	// ExecKind is the kind whose payload is an exec program's
	// ({"argv": [...], "env": {...}}): its env gets the LEASEPOOL_FLOW_*
	// variables. Default "exec"; "-" for none.
	ExecKind string
}

type stepCtxKey struct{}

// stepCtx is what a step's handler reads through its context.
type stepCtx struct {
	ref    StepRef
	params map[string]json.RawMessage
}

// CurrentStep returns the flow step a handler runs, if it runs one.
func CurrentStep(ctx context.Context) (StepRef, bool) {
	sc, ok := ctx.Value(stepCtxKey{}).(*stepCtx)
	if !ok {
		return StepRef{}, false
	}
	return sc.ref, true
}

// Params returns the shared parameters as they stood when the step was
// published: the request's and each finished step's result by step name.
func Params(ctx context.Context) map[string]json.RawMessage {
	if sc, ok := ctx.Value(stepCtxKey{}).(*stepCtx); ok {
		return sc.params
	}
	return nil
}

// Middleware runs flow steps: every worker that may claim a step task must
// use it (consumer.Mux.Use). For a step task it unwraps the envelope (the
// handler sees the step's own payload and reads the shared parameters
// through Params; its result is what it gives Job.SetResult), bounds the attempt by the step's timeout, and records
// the outcome in the flow by compare-and-set before the task's own outcome
// is written, then publishes the next step. A step the flow has already
// recorded (its worker died between the flow's write and the task's) is
// not run again. Other tasks pass through untouched.
func Middleware(cfg MiddlewareConfig) consumer.Middleware {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ExecKind == "" {
		cfg.ExecKind = "exec"
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			env, ok := stepEnvelope(job.Task)
			if !ok {
				return next.Handle(ctx, job)
			}
			return runStep(ctx, cfg, next, job, env)
		})
	}
}

func runStep(ctx context.Context, cfg MiddlewareConfig, next consumer.Handler, job *consumer.Job, env envelope) error {
	ref := env.Flow
	log := cfg.Logger.With(slog.String("flow", ref.Flow), slog.String("task", job.Task.Key), slog.Int("attempt", job.Attempt))
	// Of a large flow, only the head and the part that holds the step.
	f, err := readStep(ctx, cfg.Store, ref)
	if err != nil {
		return fmt.Errorf("flow step %s: %w", job.Task.Key, err)
	}
	if !f.waitsOn(ref) {
		// Recorded already, or the flow moved on (cancel, retry): the
		// flow no longer waits on this task, so its work is not done again.
		log.Info("flow step not current; not run", slog.String("state", string(f.State)))
		return nil
	}
	if !ref.Undo && f.Step.StepType() != TypeTask {
		// A sleep step's or a signal step's timer: its time has come.
		o := timerOutcome(f.Step, f.Gen, ref.Step, time.Time{}) // its time is the recording write's
		o.Attempt = job.Attempt
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		defer cancel()
		if _, err := record(rctx, cfg.Store, ref, o, endedAttempt{job.Task.Key, job.Attempt}, log); err != nil {
			return fmt.Errorf("flow timer %s: recording: %w", job.Task.Key, err)
		}
		return nil
	}
	act := f.Step.Action
	if ref.Undo {
		act = *f.Step.Rollback
	}
	sc := &stepCtx{ref: ref, params: env.Params}
	hctx := context.WithValue(ctx, stepCtxKey{}, sc)
	if act.Timeout > 0 {
		var cancel context.CancelFunc
		hctx, cancel = context.WithTimeoutCause(hctx, time.Duration(act.Timeout), fmt.Errorf("step timeout %s", time.Duration(act.Timeout)))
		defer cancel()
	}
	// The handler sees the step's own payload; the consumer reads nothing
	// of job.Task after the handler, but put it back anyway.
	orig := job.Task
	job.Task = orig.Clone()
	job.Task.Payload = env.Payload
	restore := sync.OnceFunc(func() { job.Task = orig })
	defer restore() // a panic passes through to the consumer's recovery
	var resultFile string
	if orig.Kind == cfg.ExecKind {
		if resultFile, err = execEnv(job.Task, ref, env.Params); err != nil {
			return err
		}
		defer os.Remove(resultFile)
	}
	herr := next.Handle(hctx, job)
	restore()
	if herr != nil && hctx.Err() != nil && ctx.Err() == nil {
		herr = fmt.Errorf("%w: %w", context.Cause(hctx), herr)
	}
	var snooze *consumer.SnoozeError
	if (herr != nil && ctx.Err() != nil) || errors.As(herr, &snooze) {
		return herr // lease lost, cancelled, shutting down, snoozed: no outcome yet
	}
	o := outcome{Attempt: job.Attempt} // its time is the recording write's
	if herr == nil {
		o.Success = true
		if herr = execResult(job, resultFile); herr != nil {
			o.Success = false
		}
		o.Result = job.Output().Result
	}
	if herr != nil {
		o.Error = oneLine(herr.Error())
		// A Retryable error is retried within the lease by the consumer,
		// through this middleware again: never the last word. If the
		// consumer's last local try exhausts the task, the reconciler
		// finds the task failed.
		o.Final = lastAttempt(job, cfg.Store.Now()) && !consumer.IsRetryable(herr)
	}
	// The work is done: record it even if the lease is being lost
	// meanwhile (a slow store), rather than have the next holder redo it.
	// The flow's compare-and-set, not the lease, keeps the record single.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if _, err := record(rctx, cfg.Store, ref, o, endedAttempt{job.Task.Key, job.Attempt}, log); err != nil {
		// Not recorded: fail the attempt, so the task is retried (or the
		// reconciler sees it failed) rather than the flow stalling.
		return fmt.Errorf("flow step %s: recording the outcome: %w (step error: %v)", job.Task.Key, err, herr)
	}
	return herr
}

// recordTimeout bounds recording an outcome and publishing the next step.
const recordTimeout = 30 * time.Second

// lastAttempt reports whether a failure of job's attempt exhausts the
// task's retries, as the consumer will judge it when it writes the failure.
func lastAttempt(job *consumer.Job, now time.Time) bool {
	t := job.Task
	return t.CountWorkers(now).Unexpected+1 > t.MaxUnexpectedRetries
}

// execEnv adds the LEASEPOOL_FLOW_* variables to an exec payload's env and
// returns the file the program may write its JSON result to.
func execEnv(t *task.Task, ref StepRef, params map[string]json.RawMessage) (string, error) {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(t.Payload, &p); err != nil || p == nil {
		return "", nil // not an object: exec reports it
	}
	env := map[string]string{}
	if raw, ok := p["env"]; ok {
		if err := json.Unmarshal(raw, &env); err != nil {
			return "", nil
		}
	}
	f, err := os.CreateTemp("", "leasepool-flow-result-*")
	if err != nil {
		return "", fmt.Errorf("flow step result file: %w", err)
	}
	f.Close()
	pb, _ := json.Marshal(params)
	dir := "do"
	if ref.Undo {
		dir = "undo"
	}
	env["LEASEPOOL_FLOW_KEY"] = ref.Flow
	env["LEASEPOOL_FLOW_GEN"] = strconv.Itoa(ref.Gen)
	env["LEASEPOOL_FLOW_STEP"] = ref.Name
	env["LEASEPOOL_FLOW_STEP_N"] = strconv.Itoa(ref.Step + 1)
	env["LEASEPOOL_FLOW_DIR"] = dir
	env["LEASEPOOL_FLOW_PARAMS"] = string(pb)
	env["LEASEPOOL_FLOW_RESULT"] = f.Name()
	eb, _ := json.Marshal(env)
	p["env"] = eb
	b, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	t.Payload = b
	return f.Name(), nil
}

// execResult makes what an exec step wrote to LEASEPOOL_FLOW_RESULT
// (nothing, or one JSON value) the attempt's result.
func execResult(job *consumer.Job, path string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if !json.Valid(b) {
		return fmt.Errorf("step result in LEASEPOOL_FLOW_RESULT is not valid JSON")
	}
	return job.SetResult(json.RawMessage(b))
}

func oneLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	// Errors live in the flow document, bounded by the payload limit: a
	// step's error is a line, not a dump.
	return task.LogText(s)
}
