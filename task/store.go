package task

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Backends map their native errors onto these once, and
// callers branch with errors.Is.
var (
	ErrInvalid   = errors.New("invalid")
	ErrNotFound  = errors.New("task not found")
	ErrConflict  = errors.New("version conflict")
	ErrLeaseLost = errors.New("lease lost")
	ErrCancelled = fmt.Errorf("%w: task cancelled", ErrLeaseLost)
	ErrUnpinned  = fmt.Errorf("%w: worker no longer among specific_worker_ids", ErrLeaseLost)
	// ErrTaskDone means other workers finished the task (enough successes,
	// or retries exhausted) while this one still ran.
	ErrTaskDone    = fmt.Errorf("%w: task finished by other workers", ErrLeaseLost)
	ErrFinished    = errors.New("task already finished")
	ErrNotFinished = errors.New("task not finished")
	ErrLocked      = errors.New("lock held")
	// ErrHistoryLost means a change stream cannot resume from its token:
	// re-query everything.
	ErrHistoryLost = errors.New("change history lost")
	// ErrWatchUnsupported means the store cannot push changes: poll.
	ErrWatchUnsupported = errors.New("change stream unsupported")
	ErrClosed           = errors.New("store closed")
)

// Store is the one seam to storage. Every method takes a context first and
// is safe for concurrent use. Both backends pass storetest.Run.
type Store interface {
	// Insert stores t if no task has t.Key, assigning ID, Seq and Version 1
	// (t is updated in place), and returns it with inserted true. If one
	// exists it returns the stored task untouched with inserted false.
	// Concurrent inserts of one key yield one task.
	Insert(ctx context.Context, t *Task) (stored *Task, inserted bool, err error)
	// Get returns the task with key, or ErrNotFound.
	Get(ctx context.Context, key string) (*Task, error)
	// Update writes t if the stored version equals t.Version, storing and
	// setting t.Version+1; otherwise ErrConflict (ErrNotFound if gone).
	Update(ctx context.Context, t *Task) error
	// Candidates returns one page of unfinished tasks for the consumer.
	Candidates(ctx context.Context, q CandidateQuery) ([]*Task, error)
	// List returns one page of tasks for admin tools, in publish (seq)
	// order, oldest first or with q.Desc newest first; see ListQuery.
	// Documents whose key has ReservedPrefix are never listed.
	List(ctx context.Context, q ListQuery) ([]*Task, error)
	// Stats counts tasks by state and kind (kept by the writes or from
	// indexes, never by reading the documents), leaving out documents
	// whose key has ReservedPrefix.
	Stats(ctx context.Context) (Stats, error)
	// Watch opens a change stream of task writes, and of the document
	// writes in p.Documents' namespaces. It returns
	// ErrWatchUnsupported where the backend cannot push, and
	// ErrHistoryLost where it cannot resume from p.ResumeAfter.
	Watch(ctx context.Context, p WatchParams) (ChangeStream, error)
	// AcquireLocks takes every key of p.Namespace for holder until
	// p.Until, or none: a key held by another holder whose lease is ahead
	// of p.Now fails the call with a *LockedError. Acquiring again as the
	// same holder renews. With p.Line, keys are served in line order (see
	// LockLine). A key in one namespace never stops a caller in another.
	AcquireLocks(ctx context.Context, p LockParams) error
	// ReleaseLocks frees the keys still held by p.Holder, after entering
	// p.Heirs' places in the same write.
	ReleaseLocks(ctx context.Context, p LockParams) error
	// DeleteFinished deletes at most p.Limit tasks in the finished state
	// p.State whose updated_at is before p.Before, and returns how many.
	// The condition is checked by the delete itself, so a task rerun or
	// written since it was selected is never deleted (retention).
	DeleteFinished(ctx context.Context, p DeleteParams) (int, error)
	// The worker registry: one record per live worker process.
	Registry
	// Versioned documents of state that is not a task, written by
	// compare-and-set and heard on the change stream.
	DocumentStore
	// Now is the store's clock as best known here: leases are written and
	// compared in it so that skewed hosts agree.
	Now() time.Time
	Close() error
}

// CandidateQuery selects unfinished tasks (pending or running) that a
// worker could claim.
type CandidateQuery struct {
	// Kinds limits the kinds; empty means every kind.
	Kinds []string
	// WorkerID drops tasks pinned to other workers; empty keeps all.
	WorkerID string
	// Now splits ready from upcoming tasks.
	Now time.Time
	// Ready selects next_claim_at <= Now in priority (desc), next_claim_at,
	// seq order: within a priority, the task ready longest comes first
	// (for tasks published to run at once, publish order); otherwise
	// next_claim_at > Now in next_claim_at then seq order.
	Ready bool
	// After continues a previous page after this task (in the same order).
	After *Task
	// Share, when not empty, keeps the pinned tasks and, of the others,
	// those whose ShareBucket is listed: the part of a backlog a worker
	// among many is preferred for, so that W workers reading a long
	// queue read each task about once between them, not W times.
	Share []int
	// Group, when not empty, keeps the tasks of that group alone: a
	// worker tops up its heap with a group's head when another group's
	// backlog fills it (consumer/groups.go).
	Group string
	// Limit is the page size; required.
	Limit int
}

// ShareBuckets is how many share buckets tasks fall into by seq (a power
// of two: stores may take the bucket with a mask).
const ShareBuckets = 4096

// ShareBucket is the share bucket of the task of sequence number seq
// (CandidateQuery.Share): tasks published one after another fall into
// different buckets, so every share of a backlog is spread along it. The
// higher bits are folded in so that seqs spaced alike (store-time
// nanoseconds of a clock that counts in microseconds, say) still fill
// every bucket.
func ShareBucket(seq int64) int {
	x := uint64(seq)
	return int((x ^ x>>12 ^ x>>24) % ShareBuckets)
}

// Less reports whether a comes before b in q's order.
func (q CandidateQuery) Less(a, b *Task) bool {
	if q.Ready && a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if !a.NextClaimAt.Equal(b.NextClaimAt) {
		return a.NextClaimAt.Before(b.NextClaimAt)
	}
	return a.Seq < b.Seq
}

// Token is an opaque resume position in a change stream.
type Token []byte

// WatchParams opens a change stream.
type WatchParams struct {
	// ResumeAfter resumes after this token; nil starts from now.
	ResumeAfter Token
	// SkipQuiet leaves out the writes that cannot make a task claimable
	// sooner (Task.Quiet: lease renewals), for workers keeping claim
	// times; readers of lifecycle events leave it unset.
	SkipQuiet bool
	// Documents names the namespaces whose document writes the stream
	// carries as well (Event.Document); none by default, so a stream
	// opened for tasks sees task writes only.
	Documents []string
	// NoTasks leaves task writes out: the stream carries the document
	// writes of Documents alone. Its tokens resume such a stream only.
	NoTasks bool
}

// Event is one task write seen on a change stream, or with Document set,
// one document write.
type Event struct {
	// Key is the task's key; empty for a document write.
	Key string
	// Task is the document after the write, or nil when the stream could
	// not carry it: re-read it by Key. The embedded store records each
	// write's own document (its payload is the current one); MongoDB looks
	// the document up when the event is read (updateLookup), so it may be
	// a later write's.
	Task *Task
	// Version is the version this write stored, where the stream tells it
	// apart from Task's (MongoDB's update events); 0 when not known.
	Version int64
	// Document is the document a write stored, on streams that asked for
	// its namespace; nil for a task write. It holds Namespace and ID alone
	// for a delete (DocumentDeleted), and where the stream could not carry
	// the document (Version 0): re-read it. Document writes keep their
	// order among themselves; MongoDB delivers them beside task writes
	// from a second stream, so not in order with those.
	Document        *Document
	DocumentDeleted bool
	// Token resumes the stream after this event.
	Token Token
}

// ChangeStream delivers task writes in order. Next blocks until an event,
// an error, or ctx is done. After an error the stream is dead: reopen it
// from ResumeToken, and on ErrHistoryLost re-query everything.
type ChangeStream interface {
	Next(ctx context.Context) (Event, error)
	// ResumeToken is the latest position, including positions passed
	// without events, so a quiet stream does not age out.
	ResumeToken() Token
	Close() error
}

// Holder identifies who holds a lease or a lock: one attempt of one worker
// process on one task. Instance is the worker process's random instance id
// (see WorkerInfo): two processes started under one worker id differ in it,
// so neither can renew or release what the other holds.
type Holder struct {
	TaskKey  string `json:"task_key"`
	WorkerID string `json:"worker_id"`
	Attempt  int    `json:"attempt"`
	Instance string `json:"instance,omitempty"`
}

// LockNamespace holds lock keys apart: the same key in two namespaces
// names two leases, each with its own holder, line and expiry, so keys
// that leasepool takes itself never collide with the keys of tasks.
type LockNamespace string

// The namespaces leasepool uses. A store takes any other name too, none
// holding a NUL byte.
const (
	// LockTask holds tasks' lock keys (Options.LockKeys); it is the zero
	// value.
	LockTask LockNamespace = ""
	// LockRate holds rate-limit slots (control.Bucket.SlotKey).
	LockRate LockNamespace = "rate"
	// LockSingleton holds the leases of work with one holder in the
	// cluster (internal/singleton: the flow reconciler, retention, the
	// embedded MQTT broker's host).
	LockSingleton LockNamespace = "singleton"
	// LockConcurrency holds concurrency-limit slots (control.Slots): a
	// running task holds one of a limit's N with its lease.
	LockConcurrency LockNamespace = "concurrency"
)

// LockParams takes or frees lock keys.
type LockParams struct {
	// Namespace is where Keys (and Heirs' keys) live; zero is LockTask.
	Namespace LockNamespace
	Keys      []string
	Holder    Holder
	Now       time.Time // store time; a holder whose Until is not after Now has lost it
	Until     time.Time
	// Line, when set, makes AcquireLocks serve each key's waiting line in
	// order across every worker: see LockLine. Nil takes a free key
	// whoever waits for it (the broker lease and rate-limit slots).
	Line *LockLine
	// Heirs, with ReleaseLocks, are places entered into the released keys'
	// lines before the keys are free: the tasks that waited behind the
	// holder in its own process, which never tried the store while the key
	// was busy there, keep their rank against other workers' waiting tasks.
	Heirs []LinePlace
}

// Validate refuses a NUL byte in the namespace or a key (Keys, Heirs'
// lock keys), which a store may use to join a namespace to a key. Its
// errors wrap ErrInvalid. Stores call it on every AcquireLocks and
// ReleaseLocks.
func (p LockParams) Validate() error {
	if strings.IndexByte(string(p.Namespace), 0) >= 0 {
		return invalid("lock namespace", fmt.Sprintf("%q has a NUL byte", p.Namespace))
	}
	for _, k := range p.Keys {
		if strings.IndexByte(k, 0) >= 0 {
			return invalid("lock key", fmt.Sprintf("%q has a NUL byte", k))
		}
	}
	for _, h := range p.Heirs {
		if strings.IndexByte(h.LockKey, 0) >= 0 {
			return invalid("heir lock key", fmt.Sprintf("%q has a NUL byte", h.LockKey))
		}
	}
	return nil
}

// LinePlace is a task's place in the waiting line of one lock key.
type LinePlace struct {
	LockKey string
	TaskKey string
	LockLine
}

// LockLine places the holder's task in the waiting line of the lock keys it
// cannot take, ranked by Priority (higher first), then Seq (publish
// order). AcquireLocks with a Line fails with a *LockedError (Ahead set)
// while a live place of another task ranks ahead on a key not already
// held by the caller; on failure it enters, or renews, the task's place in
// the line of the key that stopped it, live until Until (a worker that
// stops trying, dead or paused, holds the line no longer than that); on
// success it leaves the lines of the keys it took. A place whose task is
// finished or cancelled never stands ahead.
type LockLine struct {
	Priority int
	Seq      int64
	Until    time.Time
}

// Ahead reports whether a place (priority, seq) ranks before the line's own.
func (l LockLine) Ahead(priority int, seq int64) bool {
	return priority > l.Priority || (priority == l.Priority && seq < l.Seq)
}

// LockedError says which key is held, by whom, and until when; or, with
// Ahead, which task waits ahead in its line (Holder.TaskKey) and until
// when its place lasts.
type LockedError struct {
	Namespace LockNamespace
	Key       string
	Holder    Holder
	Until     time.Time
	Ahead     bool
}

func (e *LockedError) Error() string {
	name := e.Key
	if e.Namespace != LockTask {
		name = fmt.Sprintf("%s (namespace %s)", e.Key, e.Namespace)
	}
	if e.Ahead {
		return fmt.Sprintf("lock %s: task %s waits ahead (until %s)", name, e.Holder.TaskKey, e.Until.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("lock %s held by %s/%s attempt %d until %s", name, e.Holder.TaskKey, e.Holder.WorkerID, e.Holder.Attempt, e.Until.Format(time.RFC3339Nano))
}

func (e *LockedError) Unwrap() error { return ErrLocked }
