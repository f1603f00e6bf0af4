package consumer

// A remote worker's claim: the long poll, one pass over the candidates
// (its share first), and each claim by the Go worker's rules.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

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
		return j.Task.Attempts[i].LeaseUntil
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
		if r.cfg.Finished != nil {
			r.cfg.Finished(ctx, doc)
		}
	case err == nil:
		i := doc.Entry(try.holder)
		if i < 0 || !r.cfg.Store.Now().Before(doc.Attempts[i].LeaseUntil) {
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
