package consumer

// Remote workers: processes in any language that run tasks over HTTP
// (docs/http-api.md#remote-workers). RemoteWorkers claims, renews and
// finishes on their behalf with a Go worker's rules (claimRules, the
// ping package's renewal, the outcome writes of settle) and keeps nothing
// that outlives a call: the lease is the task document's and the
// registration the registry's, so any number of servers over one store
// serve the same remote workers.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/ping"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// Bounds of the remote worker protocol.
const (
	// RemoteMaxClaim is the most tasks one claim call takes.
	RemoteMaxClaim = 256
	// RemoteMaxWait is the longest a claim call waits for a task.
	RemoteMaxWait = time.Minute
	// RemoteMaxHeld is the most attempts one heartbeat may ask about.
	RemoteMaxHeld = 4096
	// RemoteMaxLogLines is the most log lines one renew or finish carries.
	RemoteMaxLogLines = task.MaxLogLines
	// RemoteMaxClaimBytes bounds the payloads one claim call hands out
	// (at least one task's, whatever its size): 256 tasks of 1 MiB would
	// otherwise make one answer of 256 MiB.
	RemoteMaxClaimBytes = 8 << 20
)

// RemoteConfig configures RemoteWorkers.
type RemoteConfig struct {
	Store task.Store
	// HeartbeatInterval is how often a remote worker is asked to call
	// Heartbeat (default 2s); HeartbeatTimeout how long its registration
	// lasts after a call (default 10s: an HTTP client in a garbage
	// collected runtime misses a beat more often than a Go worker).
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// RetryPolicy is how long a failed attempt waits (default as
	// Config.RetryPolicy's).
	RetryPolicy RetryPolicy
	// Reaped is called with a task a claim wrote as failed because
	// expired attempts used up its retries (see Config.Reaped).
	Reaped func(ctx context.Context, t *task.Task)
	// SafetyPoll bounds a waiting claim's sleep between store queries
	// (default 1s): change events wake it sooner, but a lease that ends
	// is no write.
	SafetyPoll time.Duration
	Logger     *slog.Logger
}

// RemoteWorkers claims, renews and finishes attempts for remote workers.
// It is safe for concurrent use; its only state is a cache of the rate
// limits' slot locks and, while claims wait, one change stream.
type RemoteWorkers struct {
	cfg   RemoteConfig
	slots slotTable
	bell  doorbell
}

// NewRemoteWorkers returns the RemoteWorkers of cfg.
func NewRemoteWorkers(cfg RemoteConfig) (*RemoteWorkers, error) {
	if cfg.Store == nil {
		return nil, errors.New("consumer: RemoteConfig.Store is required")
	}
	setDefault(&cfg.HeartbeatInterval, 2*time.Second)
	setDefault(&cfg.HeartbeatTimeout, 10*time.Second)
	setDefault(&cfg.SafetyPoll, time.Second)
	if cfg.HeartbeatTimeout <= cfg.HeartbeatInterval {
		return nil, fmt.Errorf("consumer: RemoteConfig.HeartbeatTimeout (%s) must exceed HeartbeatInterval (%s)", cfg.HeartbeatTimeout, cfg.HeartbeatInterval)
	}
	if cfg.RetryPolicy == nil {
		cfg.RetryPolicy = ExponentialBackoff(time.Second, 5*time.Minute)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &RemoteWorkers{cfg: cfg}
	r.bell.store, r.bell.logger = cfg.Store, cfg.Logger
	return r, nil
}

// Close ends the change stream that wakes waiting claims (they poll
// after it) and waits for it to close.
func (r *RemoteWorkers) Close() { r.bell.close() }

// HeartbeatInterval and HeartbeatTimeout are what remote workers are told.
func (r *RemoteWorkers) HeartbeatInterval() time.Duration { return r.cfg.HeartbeatInterval }
func (r *RemoteWorkers) HeartbeatTimeout() time.Duration  { return r.cfg.HeartbeatTimeout }

// RemoteWorker is one remote worker process's heartbeat.
type RemoteWorker struct {
	ID, Instance string
	Kinds        []string
	Concurrency  int
	Running      int
	Host         string
	PID          int
	// Held is the attempts the process runs now.
	Held []RemoteAttempt
}

// RemoteAttempt names one attempt a remote worker holds: the holder of a
// lease, fenced by the attempt number.
type RemoteAttempt struct {
	Key, WorkerID, Instance string
	Attempt                 int
	// Kinds, when not empty, are the only kinds the caller may renew or
	// finish (a worker credential's); others fail with ErrKindNotAllowed.
	Kinds []string
}

// ErrKindNotAllowed refuses a renew or finish of a task whose kind the
// caller's credential does not cover.
var ErrKindNotAllowed = errors.New("kind not allowed for this credential")

func (a RemoteAttempt) holder() task.Holder {
	return task.Holder{TaskKey: a.Key, WorkerID: a.WorkerID, Instance: a.Instance, Attempt: a.Attempt}
}

// LostAttempt is a held attempt that is no longer its process's, and why
// (an error wrapping task.ErrLeaseLost, ErrCancelled, ErrTaskDone or
// ErrUnpinned; task.ErrNotFound when the task is gone).
type LostAttempt struct {
	RemoteAttempt
	Cause error
}

// Heartbeat registers w, or renews its registration, and reports which of
// its held attempts it has lost. It fails with an error wrapping
// task.ErrWorkerIDTaken while another live instance holds the id.
func (r *RemoteWorkers) Heartbeat(ctx context.Context, w RemoteWorker) (task.WorkerInfo, []LostAttempt, error) {
	if len(w.Held) > RemoteMaxHeld {
		return task.WorkerInfo{}, nil, fmt.Errorf("%w: held: more than %d attempts", task.ErrInvalid, RemoteMaxHeld)
	}
	if w.Concurrency < 0 || w.Running < 0 {
		return task.WorkerInfo{}, nil, fmt.Errorf("%w: concurrency and running must not be negative", task.ErrInvalid)
	}
	if err := validateRemoteKinds(w.Kinds); err != nil {
		return task.WorkerInfo{}, nil, err
	}
	now := r.cfg.Store.Now()
	info := task.WorkerInfo{
		ID: w.ID, Instance: w.Instance, Host: w.Host, PID: w.PID, StartedAt: now.UTC(),
		Kinds: w.Kinds, Concurrency: w.Concurrency, Running: w.Running,
		Heartbeat: now.UTC(), Until: now.Add(r.cfg.HeartbeatTimeout).UTC(),
	}
	if err := task.ValidateWorkerInfo(info); err != nil {
		return task.WorkerInfo{}, nil, err
	}
	if prev, ok, err := r.registration(ctx, w.ID); err != nil {
		return task.WorkerInfo{}, nil, err
	} else if ok && prev.Instance == w.Instance {
		info.StartedAt = prev.StartedAt
	}
	if err := r.cfg.Store.RegisterWorker(ctx, task.RegisterParams{Worker: info, Now: now}); err != nil {
		return task.WorkerInfo{}, nil, err
	}
	var lost []LostAttempt
	for _, a := range w.Held {
		a.WorkerID, a.Instance = w.ID, w.Instance
		doc, err := r.cfg.Store.Get(ctx, a.Key)
		switch {
		case errors.Is(err, task.ErrNotFound):
			lost = append(lost, LostAttempt{a, err})
			continue
		case err != nil:
			return info, lost, err
		}
		if cause := ping.New(r.cfg.Store, doc, a.holder(), r.cfg.Logger).Observe(doc); cause != nil {
			lost = append(lost, LostAttempt{a, cause})
		} else if i := doc.Entry(a.holder()); !doc.Workers[i].Live(now) {
			lost = append(lost, LostAttempt{a, fmt.Errorf("lease expired: %w", task.ErrLeaseLost)})
		}
	}
	return info, lost, nil
}

// validateRemoteKinds refuses a kind that is no name, and leasepool's own
// kinds (flow timers and the like, task.DocumentPrefix): a remote worker
// running them would take them from the Go workers that must.
func validateRemoteKinds(kinds []string) error {
	for i, k := range kinds {
		field := fmt.Sprintf("kinds[%d]", i)
		if err := task.ValidateName(field, k); err != nil {
			return err
		}
		if strings.HasPrefix(k, task.DocumentPrefix) {
			return fmt.Errorf("%w: %s: %q is leasepool's own kind", task.ErrInvalid, field, k)
		}
	}
	return nil
}

// Unregister deletes id's registration if instance still holds it, and
// fails with ErrNotRegistered if it does not.
func (r *RemoteWorkers) Unregister(ctx context.Context, id, instance string) error {
	reg, ok, err := r.registration(ctx, id)
	if err != nil {
		return err
	}
	if !ok || reg.Instance != instance {
		return fmt.Errorf("worker %s instance %s: %w", id, instance, ErrNotRegistered)
	}
	return r.cfg.Store.UnregisterWorker(ctx, id, instance)
}

func (r *RemoteWorkers) registration(ctx context.Context, id string) (task.WorkerInfo, bool, error) {
	ws, err := r.cfg.Store.Workers(ctx)
	if err != nil {
		return task.WorkerInfo{}, false, err
	}
	for _, w := range ws {
		if w.ID == id {
			return w, true, nil
		}
	}
	return task.WorkerInfo{}, false, nil
}

// ErrNotRegistered means a claim came from a worker instance with no live
// registration: it must call Heartbeat first (again, after a pause longer
// than HeartbeatTimeout).
var ErrNotRegistered = errors.New("worker not registered")

// RemoteClaim asks for up to Max tasks of Kinds for worker ID's Instance,
// waiting up to Wait for the first.
type RemoteClaim struct {
	ID, Instance string
	Kinds        []string // empty: the registered kinds
	Max          int
	Wait         time.Duration
}

// RemoteJob is one claimed attempt, as written.
type RemoteJob struct {
	Task   *task.Task
	Holder task.Holder
}

// LeaseUntil is when the claimed attempt's lease ends unless renewed.
func (j RemoteJob) LeaseUntil() time.Time {
	if i := j.Task.Entry(j.Holder); i >= 0 {
		return j.Task.Workers[i].LeaseUntil
	}
	return time.Time{}
}

// Claim claims up to c.Max ready tasks of c's kinds that the rules let
// the worker claim, in claim order (priority, then readiness, then
// publish order). With none, it waits for a store write, the next claim
// time it knows of, or c.Wait, whichever is first, and looks again; it
// returns an empty list when c.Wait passes. It fails with
// ErrNotRegistered when the instance holds no live registration.
func (r *RemoteWorkers) Claim(ctx context.Context, c RemoteClaim) ([]RemoteJob, error) {
	switch {
	case c.Max < 1 || c.Max > RemoteMaxClaim:
		return nil, fmt.Errorf("%w: max: must be 1 to %d, not %d", task.ErrInvalid, RemoteMaxClaim, c.Max)
	case c.Wait < 0 || c.Wait > RemoteMaxWait:
		return nil, fmt.Errorf("%w: wait_ms: must be 0 to %d", task.ErrInvalid, RemoteMaxWait.Milliseconds())
	}
	if err := validateRemoteKinds(c.Kinds); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(c.Wait)
	for {
		ws, err := r.cfg.Store.Workers(ctx)
		if err != nil {
			return nil, err
		}
		now := r.cfg.Store.Now()
		i := slices.IndexFunc(ws, func(w task.WorkerInfo) bool { return w.ID == c.ID })
		if i < 0 || ws[i].Instance != c.Instance || !ws[i].Live(now) {
			return nil, fmt.Errorf("worker %s instance %s: %w", c.ID, c.Instance, ErrNotRegistered)
		}
		kinds := c.Kinds
		if len(kinds) == 0 {
			kinds = ws[i].Kinds
		}
		if len(kinds) == 0 {
			return nil, fmt.Errorf("%w: kinds: none given and none registered", task.ErrInvalid)
		}
		// The claim spread, as a Go worker's: this worker's share of the
		// backlog first (the buckets it ranks first for among the live
		// workers of its kinds, Go or remote), so that workers draining
		// one backlog read and claim apart; the rest after.
		share := preempt.NewPeers(ws, ws[i], now).Share(c.ID, kinds)
		rang := r.bell.listen()
		jobs, next, err := r.claimOnce(ctx, c, kinds, share)
		if len(jobs) > 0 || err != nil {
			r.bell.leave()
			return jobs, err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			r.bell.leave()
			return nil, nil
		}
		wait = min(wait, r.cfg.SafetyPoll)
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(r.cfg.Store.Now()), time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-rang:
		case <-t.C:
		}
		t.Stop()
		r.bell.leave()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// claimPages bounds the candidate pages one pass reads: tasks passed over
// (locked, limited, full) are re-read on the next pass.
const claimPages = 4

// claimOnce makes one pass over the ready tasks of kinds. next is the
// earliest time it learnt that a task it passed over may become
// claimable (zero: none known).
func (r *RemoteWorkers) claimOnce(ctx context.Context, c RemoteClaim, kinds []string, share []int) (jobs []RemoteJob, next time.Time, err error) {
	store := r.cfg.Store
	ctl, err := control.Load(ctx, store)
	if err != nil {
		return nil, time.Time{}, err
	}
	rules := &claimRules{
		store: store, self: task.Holder{WorkerID: c.ID, Instance: c.Instance},
		controls: func() *control.State { return ctl }, slots: &r.slots, logger: r.cfg.Logger,
	}
	later := func(at time.Time) {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	q := task.CandidateQuery{Kinds: kinds, WorkerID: c.ID, Now: store.Now(), Ready: true, Limit: max(2*c.Max, 16), Share: share}
	// The share comes first among tasks of the top priority only: a task
	// of higher priority outside it is never left for lower ones in it.
	top := 0
	if share != nil {
		first, err := store.Candidates(ctx, task.CandidateQuery{Kinds: kinds, WorkerID: c.ID, Now: q.Now, Ready: true, Limit: 1})
		if err != nil {
			return nil, next, err
		}
		if len(first) > 0 {
			top = first[0].Priority
		}
	}
	tried := map[string]bool{} // in the share pass, not to be tried again after
	bytes := 0                 // of the payloads claimed
	for page := 0; page < 2*claimPages && len(jobs) < c.Max && bytes < RemoteMaxClaimBytes; page++ {
		cands, err := store.Candidates(ctx, q)
		if err != nil {
			return jobs, next, err
		}
		full := len(cands) == q.Limit
		var last *task.Task
		if full {
			last = cands[len(cands)-1]
		}
		if q.Share == nil {
			cands = slices.DeleteFunc(cands, func(t *task.Task) bool { return tried[t.Key] })
		} else {
			if i := slices.IndexFunc(cands, func(t *task.Task) bool { return t.Priority < top }); i >= 0 {
				cands, full = cands[:i], false // the share's top priority is read
			}
			for _, t := range cands {
				tried[t.Key] = true
			}
		}
		// As many claims at once as tasks are wanted: the store commits
		// concurrent writes together (one sync for the lot on the
		// embedded store), where one after another each waits for its own.
		for rest := cands; len(rest) > 0 && len(jobs) < c.Max && bytes < RemoteMaxClaimBytes; {
			var batch []*task.Task
			batch, rest = claimBatch(rest, c.Max-len(jobs), RemoteMaxClaimBytes-bytes, len(jobs) == 0)
			n := len(batch)
			if n == 0 {
				break // the next task's payload is over what is left of the bytes
			}
			type result struct {
				job RemoteJob
				at  time.Time
				ok  bool
			}
			results := make([]result, n)
			var wg sync.WaitGroup
			for i, t := range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := &results[i]
					res.job, res.at, res.ok = r.claimTask(ctx, rules, t)
				}()
			}
			wg.Wait()
			for _, res := range results {
				if res.ok {
					jobs = append(jobs, res.job)
					bytes += len(res.job.Task.Payload)
				}
				later(res.at)
			}
		}
		switch {
		case full:
			q.After = last
		case q.Share != nil:
			// The share is read: the rest of the backlog, from its start.
			q.Share, q.After = nil, nil
		default:
			page = 2 * claimPages
		}
	}
	if len(jobs) == 0 {
		// The next task to become ready, which no write announces.
		q.Ready, q.After, q.Limit = false, nil, 1
		if up, err := store.Candidates(ctx, q); err == nil && len(up) > 0 {
			later(up[0].NextClaimAt)
		}
	}
	return jobs, next, nil
}

// claimBatch takes up to n of cands, in order, with payloads of at most
// budget bytes between them (but one, when first is set), to claim at
// once. It leaves for a later batch each task that shares a lock key with
// one taken: the line of a key serves the earlier (higher priority)
// first, which a concurrent claim of the later one could overtake.
func claimBatch(cands []*task.Task, n, budget int, first bool) (batch, rest []*task.Task) {
	keys := map[string]bool{}
	for i, t := range cands {
		if len(batch) == n || (len(t.Payload) > budget && !(first && len(batch) == 0)) {
			// Full: the rest waits for the next call.
			return batch, append(rest, cands[i:]...)
		}
		shares := false
		for _, k := range t.LockKeys {
			shares = shares || keys[k]
		}
		if shares {
			rest = append(rest, t)
			continue
		}
		budget -= len(t.Payload)
		for _, k := range t.LockKeys {
			keys[k] = true
		}
		batch = append(batch, t)
	}
	return batch, rest
}

// claimTask tries to claim t. When it cannot, at is when it may (zero:
// not known).
func (r *RemoteWorkers) claimTask(ctx context.Context, rules *claimRules, t *task.Task) (job RemoteJob, at time.Time, ok bool) {
	timeout := time.Duration(t.WorkerTimeout)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	try := &claimTry{r: rules, ctx: wctx}
	cur := t
	if takesOver(cur, rules.self.WorkerID, r.cfg.Store.Now()) {
		cur = nil // decide a takeover on the stored document (see attempt)
	}
	doc, err := task.ModifyFrom(wctx, r.cfg.Store, t.Key, cur, try.claim)
	var wait *notNow
	var locked *task.LockedError
	var limited *rateLimited
	switch {
	case err == nil && try.reaped:
		r.cfg.Logger.Warn("task failed: workers expired and retries are exhausted", slog.String("task", t.Key))
		if r.cfg.Reaped != nil {
			r.cfg.Reaped(ctx, doc)
		}
	case err == nil:
		i := doc.Entry(try.holder)
		if i < 0 || !r.cfg.Store.Now().Before(doc.Workers[i].LeaseUntil) {
			// The claim landed after its own lease: do not hand it out.
			try.free()
			return job, at, false
		}
		return RemoteJob{Task: doc, Holder: try.holder}, at, true
	case errors.As(err, &wait):
		if wait.Verdict == preempt.Later {
			at = wait.At
		}
	case errors.As(err, &limited):
		at = limited.until
	case errors.As(err, &locked):
		at = locked.Until
	case errors.Is(err, errPaused), errors.Is(err, task.ErrNotFound):
	default:
		try.free()
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("remote claim", slog.String("task", t.Key), slog.Any("err", err))
		}
	}
	return job, at, false
}

// Renew extends a's lease, appending log to its attempt's log in the same
// write. It returns the document written, or an error wrapping
// task.ErrLeaseLost (ErrCancelled, ErrTaskDone, ErrUnpinned) with nothing
// written, or task.ErrNotFound.
func (r *RemoteWorkers) Renew(ctx context.Context, a RemoteAttempt, log []string) (*task.Task, error) {
	ren, err := r.renewer(ctx, a)
	if err != nil {
		return nil, err
	}
	if len(log) > RemoteMaxLogLines {
		return nil, fmt.Errorf("%w: log: more than %d lines", task.ErrInvalid, RemoteMaxLogLines)
	}
	err = ren.RenewAnd(ctx, func(t *task.Task, now time.Time) { appendLog(t, a.holder(), log, now) })
	return ren.Doc(), err
}

// renewer reads a's task and returns its Renewer, or the loss the stored
// document shows.
func (r *RemoteWorkers) renewer(ctx context.Context, a RemoteAttempt) (*ping.Renewer, error) {
	if a.Attempt < 1 {
		return nil, fmt.Errorf("%w: attempt: must be at least 1", task.ErrInvalid)
	}
	doc, err := r.cfg.Store.Get(ctx, a.Key)
	if err != nil {
		return nil, err
	}
	if len(a.Kinds) > 0 && !slices.Contains(a.Kinds, doc.Kind) {
		return nil, fmt.Errorf("task %s is of kind %q: %w", a.Key, doc.Kind, ErrKindNotAllowed)
	}
	ren := ping.New(r.cfg.Store, doc, a.holder(), r.cfg.Logger)
	if cause := ren.Observe(doc); cause != nil {
		if errors.Is(cause, task.ErrUnpinned) {
			cause = ren.Unpin(ctx)
		}
		return nil, cause
	}
	return ren, nil
}

// appendLog adds lines to h's attempt's log at now, as Job.Log would.
func appendLog(t *task.Task, h task.Holder, lines []string, now time.Time) {
	i := t.Entry(h)
	if len(lines) == 0 || i < 0 {
		return
	}
	w := t.Workers[i]
	out := task.Output{Result: w.Result, Log: slices.Clone(w.Log), LogDropped: w.LogDropped}
	for _, l := range lines {
		out.Log = append(out.Log, task.LogLine{At: now, Msg: l})
	}
	t.Record(h, out)
}

// RemoteOutcome is how a remote attempt ended.
type RemoteOutcome struct {
	// Outcome is OutcomeSucceeded, OutcomeFailed (Error says why; the
	// task retries while its retries allow), OutcomeSnoozed (for Snooze)
	// or OutcomeReleased.
	Outcome Outcome
	Result  []byte // JSON, for OutcomeSucceeded; at most task.MaxResultSize
	Error   string
	Snooze  time.Duration
	Log     []string
}

// Finish writes a's outcome and returns the document written and the
// outcome as stored (OutcomeRetried for a failure that leaves the task to
// run again). A finish from anyone but the current holder of a live lease
// is refused as Renew refuses, with nothing written.
func (r *RemoteWorkers) Finish(ctx context.Context, a RemoteAttempt, o RemoteOutcome) (*task.Task, Outcome, error) {
	if len(o.Log) > RemoteMaxLogLines {
		return nil, "", fmt.Errorf("%w: log: more than %d lines", task.ErrInvalid, RemoteMaxLogLines)
	}
	if o.Outcome == OutcomeSucceeded && len(o.Result) > 0 {
		if err := task.ValidateResult(o.Result); err != nil {
			return nil, "", err
		}
	}
	h := a.holder()
	var write func(t *task.Task, ended time.Time) error
	switch o.Outcome {
	case OutcomeSucceeded:
		write = func(t *task.Task, ended time.Time) error { return t.Succeed(h, ended) }
	case OutcomeFailed:
		if o.Error == "" {
			return nil, "", fmt.Errorf("%w: error: must say why the attempt failed", task.ErrInvalid)
		}
		write = func(t *task.Task, ended time.Time) error {
			failures := t.CountWorkers(ended).Unexpected + 1
			return t.Fail(h, o.Error, ended.Add(r.cfg.RetryPolicy(failures, errors.New(o.Error))), ended)
		}
	case OutcomeSnoozed:
		if o.Snooze < 0 || o.Snooze > 366*24*time.Hour {
			return nil, "", fmt.Errorf("%w: snooze_ms: must be 0 to a year", task.ErrInvalid)
		}
		write = func(t *task.Task, ended time.Time) error { return t.Snooze(h, ended.Add(o.Snooze), ended) }
	case OutcomeReleased:
		write = func(t *task.Task, ended time.Time) error { return t.Release(h, ended) }
	default:
		return nil, "", fmt.Errorf("%w: outcome: must be succeeded, failed, snoozed or released, not %q", task.ErrInvalid, o.Outcome)
	}
	ren, err := r.renewer(ctx, a)
	if err != nil {
		return nil, "", err
	}
	ended := r.cfg.Store.Now()
	if i := ren.Doc().Entry(h); !ren.Doc().Workers[i].Live(ended) {
		return nil, "", fmt.Errorf("task %s attempt %d: lease expired: %w", a.Key, a.Attempt, task.ErrLeaseLost)
	}
	// Locks before the outcome, whose change event wakes their waiters
	// (as run does); slots are never given back early.
	if keys := ren.Doc().LockKeys; len(keys) > 0 {
		rules := claimRules{store: r.cfg.Store, logger: r.cfg.Logger}
		rules.releaseLocks(task.LockParams{Keys: keys, Holder: h, Now: ended})
	}
	err = ren.Write(ctx, func(t *task.Task) error {
		appendLog(t, h, o.Log, ended)
		if o.Outcome == OutcomeSucceeded && len(o.Result) > 0 {
			if i := t.Entry(h); i >= 0 {
				t.Record(h, task.Output{Result: o.Result, Log: t.Workers[i].Log, LogDropped: t.Workers[i].LogDropped})
			}
		}
		return write(t, ended)
	})
	if err != nil {
		return nil, "", err
	}
	doc := ren.Doc()
	out := o.Outcome
	if out == OutcomeFailed && !doc.State.Finished() {
		out = OutcomeRetried
	}
	return doc, out, nil
}

// doorbell wakes waiting claims on every task write: one change stream,
// open while claims wait and for doorbellLinger after the last, so that a
// worker's next claim finds it open and misses no write.
type doorbell struct {
	store  task.Store
	logger *slog.Logger

	mu        sync.Mutex
	ring      chan struct{} // closed at the next write
	listeners int
	stop      context.CancelFunc // ends the follower; nil when none runs
	done      chan struct{}      // closed when the follower has returned
	linger    *time.Timer
	closed    bool
}

const doorbellLinger = 30 * time.Second

// listen returns a channel closed at the next task write; call leave
// when done waiting.
func (b *doorbell) listen() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ring == nil {
		b.ring = make(chan struct{})
	}
	b.listeners++
	if b.linger != nil {
		b.linger.Stop()
		b.linger = nil
	}
	if b.stop == nil && !b.closed {
		ctx, cancel := context.WithCancel(context.Background())
		b.stop, b.done = cancel, make(chan struct{})
		go b.follow(ctx, b.done)
	}
	return b.ring
}

func (b *doorbell) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listeners--; b.listeners == 0 && b.stop != nil {
		stop := b.stop
		b.linger = time.AfterFunc(doorbellLinger, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.listeners == 0 && b.stop != nil {
				stop()
				b.stop = nil
			}
		})
	}
}

// close ends the follower and waits for it.
func (b *doorbell) close() {
	b.mu.Lock()
	b.closed = true
	if b.linger != nil {
		b.linger.Stop()
	}
	stop, done := b.stop, b.done
	b.stop = nil
	b.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (b *doorbell) wake() {
	b.mu.Lock()
	close(b.ring)
	b.ring = make(chan struct{})
	b.mu.Unlock()
}

// follow rings at each write until ctx ends. A store that cannot stream
// leaves the claims to their safety poll.
func (b *doorbell) follow(ctx context.Context, done chan struct{}) {
	defer close(done)
	for ctx.Err() == nil {
		cs, err := b.store.Watch(ctx, task.WatchParams{SkipQuiet: true})
		if errors.Is(err, task.ErrWatchUnsupported) {
			return
		}
		if err == nil {
			for {
				if _, err = cs.Next(ctx); err != nil {
					break
				}
				b.wake()
			}
			_ = cs.Close()
		}
		if ctx.Err() != nil {
			return
		}
		b.logger.Debug("remote claims: change stream ended; reopening", slog.Any("err", err))
		// Claims poll meanwhile.
		if !sleep(ctx, time.Second) {
			return
		}
	}
}
