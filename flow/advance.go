package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/leasepool/leasepool/task"
)

// StepRef names one action of one flow run; it travels in the step task's
// payload envelope.
type StepRef struct {
	Flow string `json:"key"`
	Gen  int    `json:"gen"`
	// Step is the 0-based index; N in the task key is Step+1.
	Step int    `json:"step"`
	Name string `json:"name"`
	Undo bool   `json:"undo,omitempty"`
}

// TaskKey is the step task's key.
func (r StepRef) TaskKey() string { return StepKey(r.Flow, r.Gen, r.Step, r.Name, r.Undo) }

// envelope is a step task's payload: the action's own payload, the shared
// parameters as they stood when the step was published, and which step it
// is. Middleware unwraps it before the step's handler runs.
type envelope struct {
	Flow    StepRef                    `json:"flow"`
	Params  map[string]json.RawMessage `json:"params"`
	Payload json.RawMessage            `json:"payload,omitempty"`
	// Timeout is the action's, for a remote worker's job (StepView): the
	// middleware reads the flow's own.
	Timeout task.Duration `json:"timeout,omitempty"`
}

// TimerKind is the kind of the timer tasks of sleep steps and of signal
// steps with a timeout: due at the step's time (run_at), run by
// Middleware on any worker (Register registers the kind), and holding
// nothing while they wait.
const TimerKind = "leasepool.flow-timer"

// timerRetries: a timer's attempt only records the flow's write, so a
// failed one (its worker killed, the store away) is retried at length
// rather than left to the reconciler.
const timerRetries = 20

// ensure starts a pending flow and publishes the task of every run the
// flow waits on. Publishing is idempotent by the deterministic key, so
// calling it again after a crash, or from two places, starts one task.
func ensure(ctx context.Context, s task.Store, f *Flow) (*Flow, error) {
	if f.State == StatePending {
		var err error
		f, err = modify(ctx, s, f.Key, func(f *Flow) error {
			if !f.start(s.Now().UTC()) {
				return errUnchanged
			}
			return nil
		})
		if err != nil {
			return f, err
		}
	}
	return f, publishRuns(ctx, s, f, f.activeRuns(), endedAttempt{})
}

// activeRuns lists the runs the flow waits on that have a task.
func (f *Flow) activeRuns() []runRef {
	var out []runRef
	for i := range f.Steps {
		for _, undo := range []bool{false, true} {
			if r := f.run(i, undo); r.State == RunActive && r.Task != "" {
				out = append(out, runRef{Step: i, Undo: undo})
			}
		}
	}
	return out
}

// publishRuns publishes the tasks of runs, many at once (task.PublishMany:
// the steps a fan-out starts commit together), each idempotently by key.
func publishRuns(ctx context.Context, s task.Store, f *Flow, runs []runRef, ended endedAttempt) error {
	var errs []error
	ps := make([]task.PublishParams, 0, len(runs))
	for _, ref := range runs {
		p, err := stepParams(ctx, s, f, ref.Step, ref.Undo, ended)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ps = append(ps, p)
	}
	ictx := task.WithInternalWrite(ctx)
	switch len(ps) {
	case 0:
	case 1:
		if _, _, err := task.Publish(ictx, s, ps[0]); err != nil {
			errs = append(errs, fmt.Errorf("flow %s: publish step %s: %w", f.Key, ps[0].Key, err))
		}
	default:
		outs, err := task.PublishMany(ictx, s, ps)
		for i, o := range outs {
			if o.Err != nil {
				errs = append(errs, fmt.Errorf("flow %s: publish step %s: %w", f.Key, ps[i].Key, o.Err))
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// follow does what the write that produced f asked: publish the tasks of
// the runs it started and cancel the tasks it stopped. A crash before
// this is repaired by the reconciler (a missing task is published; a
// stopped run's timer that fires is not current any more).
func follow(ctx context.Context, s task.Store, f *Flow) error {
	return followEnded(ctx, s, f, endedAttempt{})
}

// endedAttempt names the attempt whose outcome a flow write recorded,
// from that attempt's own middleware: its handler has returned, so its
// lease, live until the attempt's own write, guards nothing.
type endedAttempt struct {
	key     string
	attempt int
}

// followEnded is follow for a write that recorded the outcome of ended.
func followEnded(ctx context.Context, s task.Store, f *Flow, ended endedAttempt) error {
	var runs []runRef
	for _, ref := range f.started {
		if r := f.run(ref.Step, ref.Undo); r.State == RunActive && r.Task != "" {
			runs = append(runs, ref)
		}
	}
	errs := []error{publishRuns(ctx, s, f, runs, ended)}
	for _, key := range f.stops {
		errs = append(errs, stopTask(ctx, s, key))
	}
	return errors.Join(errs...)
}

// waitsOn reports whether the flow waits on the run ref names.
func (f *Flow) waitsOn(ref StepRef) bool {
	return !f.State.Finished() && f.Gen == ref.Gen && ref.Step >= 0 && ref.Step < len(f.Steps) &&
		f.Steps[ref.Step].Name == ref.Name && f.run(ref.Step, ref.Undo).State == RunActive
}

// timer reports whether step i's do is a timer rather than a task's work.
func (f *Flow) timer(i int) bool { return f.Steps[i].StepType() != TypeTask }

// timerOutcome is what step i's timer firing at at means: a sleep step
// succeeds; a signal step takes its default or fails.
func (f *Flow) timerOutcome(i int, at time.Time) outcome {
	return timerOutcome(f.Steps[i], f.Gen, i, at)
}

// timerOutcome is what the timer of step i (st) of run gen firing at at
// means.
func timerOutcome(st Step, gen, i int, at time.Time) outcome {
	o := outcome{Step: i, Gen: gen, At: at, Success: true, Final: true}
	if st.StepType() == TypeSignal {
		if len(st.Default) > 0 {
			o.Result = st.Default
		} else {
			o.Success, o.Error = false, fmt.Sprintf("no signal within %s", time.Duration(st.Timeout))
		}
	}
	return o
}

// paramsFor returns the shared parameters a run sees: for a step's work,
// the request's and the results of the steps it needs, directly or
// through others; for a rollback, all of them.
func (f *Flow) paramsFor(i int, undo bool) map[string]json.RawMessage {
	if undo {
		return f.Params
	}
	needs := f.graph().needs
	out := maps.Clone(f.baseParams())
	seen := map[int]bool{}
	for stack := slices.Clone(needs[i]); len(stack) > 0; {
		k := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[k] {
			continue
		}
		seen[k] = true
		if name := f.Steps[k].Name; f.Progress[k].Do.State == RunSucceeded {
			if v, ok := f.Params[name]; ok {
				out[name] = v
			}
		}
		stack = append(stack, needs[k]...)
	}
	return out
}

// baseParams are the shared parameters but the results of succeeded
// steps, computed once per flow read: the steps a fan-out starts each add
// only their ancestors' results to them.
func (f *Flow) baseParams() map[string]json.RawMessage {
	if f.base == nil {
		idx := f.graph().index
		f.base = make(map[string]json.RawMessage, len(f.Params))
		for k, v := range f.Params {
			if j, ok := idx[k]; ok && f.Progress[j].Do.State == RunSucceeded {
				continue
			}
			f.base[k] = v
		}
	}
	return f.base
}

// stepParams is the publish of run (i, undo)'s task.
func stepParams(ctx context.Context, s task.Store, f *Flow, i int, undo bool, ended endedAttempt) (task.PublishParams, error) {
	st := f.Steps[i]
	ref := StepRef{Flow: f.Key, Gen: f.Gen, Step: i, Name: st.Name, Undo: undo}
	if !undo && f.timer(i) {
		b, err := json.Marshal(envelope{Flow: ref})
		if err != nil {
			return task.PublishParams{}, err
		}
		return task.PublishParams{Key: ref.TaskKey(), Kind: TimerKind, Payload: b, Trace: f.Trace,
			Options: task.Options{RunAt: f.Progress[i].Do.Due, MaxUnexpectedRetries: timerRetries}}, nil
	}
	act := st.Action
	if undo {
		act = *st.Rollback
	}
	// The envelope wraps the parameters and the payload, each checked
	// against task.MaxJSONDepth when the flow was published (and the
	// results as their attempts ended), a level or two deeper.
	b, err := json.Marshal(envelope{Flow: ref, Params: f.paramsFor(i, undo), Payload: act.Payload, Timeout: act.Timeout})
	if err != nil {
		return task.PublishParams{}, err
	}
	p := task.PublishParams{Key: ref.TaskKey(), Kind: act.Kind, Payload: b, Trace: f.Trace,
		Options: task.Options{LockKeys: act.LockKeys, Priority: act.Priority}}
	if act.Retries != nil {
		p.MaxUnexpectedRetries = *act.Retries
		if *act.Retries == 0 {
			p.MaxUnexpectedRetries = task.NoRetries
		}
	}
	if p.RunAt, err = afterEarlier(ctx, s, f, i, undo, ended); err != nil {
		return task.PublishParams{}, err
	}
	return p, nil
}

// afterEarlier returns when step i's action may start without overlapping
// an earlier task of the same step whose handler may still run: an undo
// waits for its do's live leases (a do cancelled by the flow is cancelled
// again, since a crash may have come between the two writes; one cancelled
// from outside the flow ends up here as a failure, its handler still
// stopping), and the do of a retried run for the previous run's task of
// that step (cancelled again too: a flow cancel's task stop may have
// failed). The lease of ended, whose handler has returned, is not waited
// for. Zero: at once.
func afterEarlier(ctx context.Context, s task.Store, f *Flow, i int, undo bool, ended endedAttempt) (time.Time, error) {
	switch {
	case undo && f.Progress[i].Do.State == RunCancelled:
		return afterLeases(ctx, s, f.Progress[i].Do.Task)
	case undo:
		return leasesEnd(ctx, s, f.Progress[i].Do.Task, ended)
	case f.Gen > 1:
		return afterLeases(ctx, s, StepKey(f.Key, f.Gen-1, i, f.Steps[i].Name, false))
	}
	return time.Time{}, nil
}

// afterLeases cancels the task of key and returns when its live leases end.
func afterLeases(ctx context.Context, s task.Store, key string) (time.Time, error) {
	if err := stopTask(ctx, s, key); err != nil {
		return time.Time{}, err
	}
	return leasesEnd(ctx, s, key, endedAttempt{})
}

// leasesEnd returns when the live leases of the task of key end (zero when
// none, or no such task).
func leasesEnd(ctx context.Context, s task.Store, key string, ended endedAttempt) (time.Time, error) {
	if key == "" {
		return time.Time{}, nil
	}
	t, err := s.Get(ctx, key)
	if errors.Is(err, task.ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	// As task.Reset: a cancel marks running entries CANCELLED, but their
	// handlers stop only at their next ping, within their leases.
	var at time.Time
	now := s.Now()
	for _, w := range t.Attempts {
		if key == ended.key && w.Attempt == ended.attempt {
			continue
		}
		if (w.State == task.AttemptRunning || w.State == task.WorkerCancelled) && w.LeaseUntil.After(now) && w.LeaseUntil.After(at) {
			at = w.LeaseUntil
		}
	}
	return at, nil
}

// record applies an outcome to the flow of ref and publishes what comes
// next; ended is the attempt recording it from its own middleware (zero
// from the reconciler, whose tasks' handlers may still be stopping).
func record(ctx context.Context, s task.Store, ref StepRef, o outcome, ended endedAttempt, log *slog.Logger) (*Flow, error) {
	o.Gen, o.Step, o.Undo = ref.Gen, ref.Step, ref.Undo
	applied := false
	f, err := modify(ctx, s, ref.Flow, func(f *Flow) error {
		// The outcome's time is the write's: ended_at is when the flow
		// recorded it, so a later attempt that began before it had passed
		// the middleware's check, and the next steps start no earlier.
		o.At = s.Now().UTC()
		if applied = f.apply(o); !applied {
			return errUnchanged
		}
		return nil
	})
	if err != nil {
		return f, err
	}
	if applied && o.Undo && o.Final && !o.Success {
		log.Error("flow rollback failed: the flow needs attention", slog.String("step", ref.Name), slog.String("error", o.Error))
	}
	return f, followEnded(ctx, s, f, ended)
}

// ReconcileStats says what a Reconcile pass did.
type ReconcileStats struct {
	Active    int // flows still moving
	Advanced  int // flows moved on from a finished step task no worker recorded
	Published int // flows whose current step task was missing
}

// Reconcile looks at every flow still moving and repairs what a crash left:
// a current step task that is missing is published (same key: never a
// second run), and one that finished without its outcome reaching the flow
// (its worker died after the task's write, or the task failed by expiry)
// moves the flow on. Safe to run anywhere at any time: every change is a
// compare-and-set that applies once.
func Reconcile(ctx context.Context, s task.Store, log *slog.Logger) (ReconcileStats, error) {
	if log == nil {
		log = slog.Default()
	}
	var st ReconcileStats
	flows, err := List(ctx, s, ListQuery{Active: true})
	if err != nil {
		return st, err
	}
	var errs []error
	for _, f := range flows {
		st.Active++
		if err := reconcileOne(ctx, s, f, &st, log); err != nil {
			errs = append(errs, fmt.Errorf("flow %s: %w", f.Key, err))
		}
	}
	return st, errors.Join(errs...)
}

// reconcileListFrom is the number of runs waited on from which a pass
// reads the flow's step tasks in pages of a list rather than one by one.
const reconcileListFrom = 64

func reconcileOne(ctx context.Context, s task.Store, f *Flow, st *ReconcileStats, log *slog.Logger) error {
	if f.State == StatePending {
		_, err := ensure(ctx, s, f)
		return err
	}
	runs := f.activeRuns()
	var tasks map[string]*task.Task
	if len(runs) >= reconcileListFrom {
		var err error
		if tasks, err = stepTasks(ctx, s, f.Key); err != nil {
			return err
		}
	}
	var errs []error
	var missing []runRef
	for _, r := range runs {
		ref := StepRef{Flow: f.Key, Gen: f.Gen, Step: r.Step, Name: f.Steps[r.Step].Name, Undo: r.Undo}
		var t *task.Task
		var err error
		if tasks != nil {
			if t = tasks[ref.TaskKey()]; t == nil {
				err = task.ErrNotFound
			}
		} else {
			t, err = s.Get(ctx, ref.TaskKey())
		}
		if errors.Is(err, task.ErrNotFound) {
			missing = append(missing, r)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, reconcileTask(ctx, s, f, ref, t, st, log))
	}
	if len(missing) > 0 {
		st.Published += len(missing)
		errs = append(errs, publishRuns(ctx, s, f, missing, endedAttempt{}))
	}
	return errors.Join(errs...)
}

// stepTasks reads every task under the flow's key prefix, by key.
func stepTasks(ctx context.Context, s task.Store, key string) (map[string]*task.Task, error) {
	out := map[string]*task.Task{}
	q := task.ListQuery{KeyPrefix: key + "/", Limit: 1000}
	for {
		page, err := s.List(ctx, q)
		if err != nil {
			return nil, err
		}
		for _, t := range page {
			out[t.Key] = t
		}
		if len(page) < q.Limit {
			return out, nil
		}
		q.AfterSeq = page[len(page)-1].Seq
	}
}

// reconcileRun publishes run (i, undo)'s task when missing, and records
// its outcome when the task finished without it reaching the flow.
func reconcileRun(ctx context.Context, s task.Store, f *Flow, i int, undo bool, st *ReconcileStats, log *slog.Logger) error {
	ref := StepRef{Flow: f.Key, Gen: f.Gen, Step: i, Name: f.Steps[i].Name, Undo: undo}
	t, err := s.Get(ctx, ref.TaskKey())
	if errors.Is(err, task.ErrNotFound) {
		st.Published++
		return publishRuns(ctx, s, f, []runRef{{Step: i, Undo: undo}}, endedAttempt{})
	}
	if err != nil {
		return err
	}
	return reconcileTask(ctx, s, f, ref, t, st, log)
}

// reconcileTask records the outcome of t, run ref's task, when it
// finished without it reaching the flow.
func reconcileTask(ctx context.Context, s task.Store, f *Flow, ref StepRef, t *task.Task, st *ReconcileStats, log *slog.Logger) error {
	if !t.State.Finished() {
		return nil
	}
	i, undo := ref.Step, ref.Undo
	o := outcome{At: t.UpdatedAt, Attempt: t.AttemptsStarted}
	switch {
	case !undo && f.timer(i):
		// However its task ended, a timer's time has come.
		o = f.timerOutcome(i, t.UpdatedAt)
	case t.State == task.StateSucceeded:
		o.Success, o.Result = true, t.Result()
	case t.State == task.StateCancelled:
		o.Final, o.Error = true, "step task cancelled"
	default:
		o.Final, o.Error = true, oneLine(lastError(t))
	}
	st.Advanced++
	log = log.With(slog.String("flow", f.Key))
	log.Info("flow: step task finished without its outcome recorded; moving on",
		slog.String("task", t.Key), slog.String("state", string(t.State)))
	_, err := record(ctx, s, ref, o, endedAttempt{}, log)
	return err
}

// TaskFinished moves the flow of t on at once: t is a task written
// finished with no flow middleware to record its outcome, which the
// reconciler would find only at its next pass (a lease of three periods
// later when its holder died with the step's worker). Such a task is one
// a worker found with expired leases and no retries left and wrote failed
// (consumer.Config.Reaped), or one a remote worker ran, whose outcome
// `serve` wrote (consumer.RemoteConfig.Finished). A task of no flow, or
// one the flow no longer waits on, is left alone; a reconciler pass at the
// same time records the outcome once (compare-and-set).
func TaskFinished(ctx context.Context, s task.Store, t *task.Task, log *slog.Logger) error {
	if t == nil || !t.State.Finished() {
		return nil
	}
	env, ok := stepEnvelope(t)
	if !ok {
		return nil
	}
	f, err := Get(ctx, s, env.Flow.Flow)
	if errors.Is(err, task.ErrNotFound) {
		return nil
	}
	if err != nil || !f.waitsOn(env.Flow) {
		return err
	}
	return reconcileRun(ctx, s, f, env.Flow.Step, env.Flow.Undo, &ReconcileStats{}, log)
}

func lastError(t *task.Task) string {
	all := t.AttemptHistory()
	for i := len(all) - 1; i >= 0; i-- {
		if e := all[i].Error; e != "" {
			return e
		}
	}
	return "step task " + string(t.State)
}
