// Package ping keeps a claimed task's lease alive: every ping_interval it
// extends the worker's lease_until (and the task's lock keys) in store time,
// and when the lease is lost (preempted, cancelled, unpinned) it says so at
// once so the running handler can be cancelled. Store outages are ridden
// out: writes are retried with backoff, and loss is reported only when the
// store says so or the lease has certainly expired.
package ping

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Renewer keeps one claimed attempt of one task: it renews the attempt's
// lease (Keep, Start), writes to the task on its behalf (Write) and says
// when the lease is lost (Observe).
type Renewer struct {
	store  task.Store
	holder task.Holder
	logger *slog.Logger

	mu  sync.Mutex
	doc *task.Task // latest document this worker wrote or read

	out func() task.Output // see Carry
}

// New returns the Renewer of holder's attempt, which a successful claim
// wrote as doc.
func New(store task.Store, doc *task.Task, holder task.Holder, logger *slog.Logger) *Renewer {
	if logger == nil {
		logger = slog.Default()
	}
	return &Renewer{store: store, holder: holder, doc: doc, logger: logger}
}

// Doc returns the latest known document.
func (l *Renewer) Doc() *task.Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.doc
}

// Carry makes each renewal also store out's value on the attempt
// (task.Record), so what a running handler recorded (its log lines) shows
// before the attempt ends, at no extra write. Call it before Keep.
func (l *Renewer) Carry(out func() task.Output) { l.out = out }

// Output is the carried output's value now (none without Carry).
func (l *Renewer) Output() task.Output {
	if l.out == nil {
		return task.Output{}
	}
	return l.out()
}

// Holder is the lock holder identity of this attempt.
func (l *Renewer) Holder() task.Holder { return l.holder }

// Write applies fn to the latest document and writes it with
// compare-and-set (task.ModifyFrom: the cached document first, re-read on
// conflict).
func (l *Renewer) Write(ctx context.Context, fn func(t *task.Task) error) error {
	doc, err := task.ModifyFrom(ctx, l.store, l.holder.TaskKey, l.Doc(), fn)
	if doc != nil {
		l.set(doc)
	}
	if errors.Is(err, task.ErrNotFound) {
		return fmt.Errorf("task %s deleted: %w", l.holder.TaskKey, task.ErrLeaseLost)
	}
	return err
}

func (l *Renewer) set(t *task.Task) {
	l.mu.Lock()
	if l.doc == nil || t.Version >= l.doc.Version {
		l.doc = t
	}
	l.mu.Unlock()
}

// Observe offers a document seen elsewhere (a change event), so the next
// write starts from it. It reports the loss it shows, if any: cancelled,
// unpinned, or this attempt gone.
func (l *Renewer) Observe(t *task.Task) error {
	l.set(t)
	if t.Cancelled {
		return task.ErrCancelled
	}
	if t.State.Finished() {
		return task.ErrTaskDone
	}
	if !t.Allows(l.holder.WorkerID) {
		return task.ErrUnpinned
	}
	if i := t.Entry(l.holder); i < 0 || t.Attempts[i].State != task.AttemptRunning {
		return task.ErrLeaseLost
	}
	return nil
}

// Renew extends the lease once, with the task's lock keys. A worker that
// is no longer pinned removes its own entry, so a permitted worker can
// claim at once, and reports ErrUnpinned.
func (l *Renewer) Renew(ctx context.Context) error { return l.RenewAnd(ctx, nil) }

// RenewAnd is Renew with also applied in the renewal's write (a remote
// worker's log lines), after the lease is extended.
func (l *Renewer) RenewAnd(ctx context.Context, also func(t *task.Task, now time.Time)) error {
	now := l.store.Now()
	// Locks first, to the same end as the lease: the document's lease is
	// then never ahead of the locks', and Remaining, which reads the
	// document, stops the handler before the locks lapse.
	if keys := l.Doc().LockKeys; len(keys) > 0 {
		until := now.Add(time.Duration(l.Doc().WorkerTimeout))
		err := l.store.AcquireLocks(ctx, task.LockParams{Keys: keys, Holder: l.Holder(), Now: now, Until: until})
		if errors.Is(err, task.ErrLocked) {
			return fmt.Errorf("%w: %w", task.ErrLeaseLost, err)
		}
		if err != nil {
			return err
		}
	}
	// The concurrency limits' slots the claim took (task.Attempt.Slots)
	// are held the same way.
	if i := l.Doc().Entry(l.Holder()); i >= 0 && len(l.Doc().Attempts[i].Slots) > 0 {
		until := now.Add(time.Duration(l.Doc().WorkerTimeout))
		err := l.store.AcquireLocks(ctx, task.LockParams{Namespace: task.LockConcurrency, Keys: l.Doc().Attempts[i].Slots, Holder: l.Holder(), Now: now, Until: until})
		if errors.Is(err, task.ErrLocked) {
			return fmt.Errorf("%w: %w", task.ErrLeaseLost, err)
		}
		if err != nil {
			return err
		}
	}
	err := l.Write(ctx, func(t *task.Task) error {
		if err := t.Renew(l.holder, now); err != nil {
			return err
		}
		if l.out != nil {
			t.Record(l.holder, l.Output())
		}
		if also != nil {
			also(t, now)
		}
		return nil
	})
	if errors.Is(err, task.ErrUnpinned) {
		return l.Unpin(ctx)
	}
	return err
}

// Unpin writes the removal of this attempt's entry after its worker was
// dropped from the pins, and returns ErrUnpinned.
func (l *Renewer) Unpin(ctx context.Context) error {
	err := l.Write(ctx, func(t *task.Task) error {
		if !t.Unpin(l.holder, l.store.Now()) {
			return errNoChange
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNoChange) && !errors.Is(err, task.ErrLeaseLost) {
		return err
	}
	return task.ErrUnpinned
}

var errNoChange = errors.New("no change")

// Keep renews the lease every ping_interval (read afresh from the document
// each time, so a changed interval applies at the next ping) until ctx is
// done. It calls lost once, with a cause wrapping task.ErrLeaseLost, when
// the lease is gone, and returns. Every renewal must succeed before the
// lease ends: a store that hangs is given until then and no longer, since
// past that point a peer may hold the task.
func (l *Renewer) Keep(ctx context.Context, lost func(cause error)) {
	l.keep(ctx, lost, l.firstPing())
}

// Start is Keep in the background until stop, which returns once the
// renewals have ended. No goroutine runs before the first renewal is due,
// so a task shorter than that costs a timer, not a goroutine to start and
// then to wait for.
func (l *Renewer) Start(lost func(cause error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	first := time.AfterFunc(l.firstPing(), func() {
		defer close(done)
		l.keep(ctx, lost, 0)
	})
	return func() {
		cancel()
		if !first.Stop() {
			<-done // it started: wait for the renewal loop to see ctx done
		}
	}
}

// firstPing is when the first renewal is due: a claim that took long
// leaves less than a full lease, so renew sooner.
func (l *Renewer) firstPing() time.Duration {
	return min(time.Duration(l.Doc().PingInterval), l.Remaining()/2)
}

// keep is Keep with the first renewal after wait.
func (l *Renewer) keep(ctx context.Context, lost func(cause error), wait time.Duration) {
	backoff := 50 * time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var storeErr error // the last renewal's failure, if it failed
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		left := l.Remaining()
		if left <= 0 && storeErr != nil {
			lost(fmt.Errorf("%w: lease expired while the store was unreachable: %w", task.ErrLeaseLost, storeErr))
			return
		}
		if left <= 0 {
			lost(fmt.Errorf("%w: lease expired before it could be renewed", task.ErrLeaseLost))
			return
		}
		rctx, cancel := context.WithTimeout(ctx, left)
		began := time.Now()
		err := l.Renew(rctx)
		cancel()
		if took := time.Since(began); took > time.Duration(l.Doc().PingInterval)/2 {
			l.logger.Warn("slow lease renewal", slog.String("task", l.holder.TaskKey), slog.Duration("took", took), slog.Any("err", err))
		}
		switch {
		case err == nil:
			l.logger.Debug("lease renewed", slog.String("task", l.holder.TaskKey), slog.Int64("version", l.Doc().Version))
			backoff, storeErr = 50*time.Millisecond, nil
			timer.Reset(time.Duration(l.Doc().PingInterval))
		case errors.Is(err, task.ErrLeaseLost):
			lost(err)
			return
		case ctx.Err() != nil:
			return
		case l.Remaining() <= 0:
			lost(fmt.Errorf("%w: lease expired while the store was unreachable: %w", task.ErrLeaseLost, err))
			return
		default:
			// The store is unreachable: keep trying while the lease may
			// still be ours.
			l.logger.Warn("lease renewal failed; retrying", slog.String("task", l.holder.TaskKey), slog.Int("attempt", l.holder.Attempt), slog.Any("err", err))
			storeErr = err
			timer.Reset(min(backoff, l.Remaining()))
			backoff = min(backoff*2, time.Duration(l.Doc().PingInterval))
		}
	}
}

// Remaining is how long this worker may still count on its lease: until
// lease_until in store time, less a tenth of worker_timeout, so that it
// stops before a peer can start (clock estimates and kill delays are not
// exact).
func (l *Renewer) Remaining() time.Duration {
	doc := l.Doc()
	i := doc.Entry(l.holder)
	if i < 0 {
		return 0
	}
	margin := time.Duration(doc.WorkerTimeout) / 10
	return doc.Attempts[i].LeaseUntil.Add(-margin).Sub(l.store.Now())
}
