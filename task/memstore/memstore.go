// Package memstore is a task.Store held in memory, for tests and
// simulations only: it passes task/storetest, and lets a test inject
// latency and faults into every call and count what each handle did
// (writes, conflicts, change events delivered). Its clock is time.Now, so
// inside a testing/synctest bubble the whole store runs on virtual time:
// waits are timers and channel receives, which a bubble can advance.
//
// A DB is one database; each Open is one handle on it, as one process
// would hold (Close ends that handle's streams only). Production code never
// imports this package.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Op names a Store call, for Latency and Fault.
type Op string

// The calls a Config can delay or fail.
const (
	OpInsert     Op = "insert"
	OpGet        Op = "get"
	OpUpdate     Op = "update"
	OpCandidates Op = "candidates"
	OpList       Op = "list"
	OpStats      Op = "stats"
	OpWatch      Op = "watch"
	OpNext       Op = "next" // a change reaching a stream, after its write
	OpAcquire    Op = "acquire"
	OpRelease    Op = "release"
	OpDelete     Op = "delete"
	OpRegister   Op = "register"
	OpWorkers    Op = "workers"
	OpDocument   Op = "document"
)

// Fault is what Config.Fault injects into one call.
type Fault struct {
	// Err is returned by the call; nil injects nothing.
	Err error
	// Applied makes the call take effect before Err is returned, as when a
	// reply is lost on the way back: the caller cannot tell.
	Applied bool
}

// Config sets a DB's injected behaviour. The zero value has none.
type Config struct {
	// Latency is how long a call waits before it takes effect (a round
	// trip to the store); nil waits nothing. key is the task or lock key,
	// where the call has one.
	Latency func(op Op, key string) time.Duration
	// Fault, when set, may fail a call.
	Fault func(op Op, key string) Fault
	// Retention bounds the change history kept for resuming streams; a
	// stream that fell further behind gets task.ErrHistoryLost. 0 keeps
	// 1 << 20 changes.
	Retention int
	// Lanes is how many delivery schedules the handles' change streams
	// share: a change reaches every stream of one lane at one moment, its
	// OpNext latency after the write, drawn once for the lane (the n-th
	// handle opened is in lane n mod Lanes). 0 gives each handle a
	// schedule of its own. A simulation of a thousand handles sets a few,
	// so that each write costs a few timers, not a thousand.
	Lanes int
}

// ErrInjected is the error faults use when a test wants a plain one.
var ErrInjected = errors.New("memstore: injected fault")

// Counts is what one handle did since it was opened.
type Counts struct {
	// Writes counts task documents written (inserts and updates that
	// applied); Conflicts counts updates refused for a stale version.
	Writes, Conflicts int64
	// Reads counts Get calls and Candidates pages; CandidateRows the
	// tasks those pages held.
	Reads, CandidateRows int64
	// Events counts change events handed to this handle's streams.
	Events int64
	// LockCalls counts AcquireLocks and ReleaseLocks calls.
	LockCalls int64
}

type counters struct {
	writes, conflicts, reads, rows, events, lockCalls atomic.Int64
}

func (c *counters) snapshot() Counts {
	return Counts{Writes: c.writes.Load(), Conflicts: c.conflicts.Load(), Reads: c.reads.Load(),
		CandidateRows: c.rows.Load(), Events: c.events.Load(), LockCalls: c.lockCalls.Load()}
}

// DB is one in-memory database shared by its handles.
type DB struct {
	cfg Config

	mu    sync.Mutex
	tasks map[string]*task.Task // by key; the stored copies, never handed out
	// open holds the unfinished tasks of tasks: a candidate page reads
	// these, so a run that finished a hundred thousand tasks does not
	// pass over them on every query.
	open    map[string]*task.Task
	nextSeq int64
	changes []change // oldest first
	dropped int64    // changes before changes[0], pruned
	// lanes are the delivery schedules of the handles that watch;
	// shared holds those of Config.Lanes by number, opened the number
	// of handles opened.
	lanes  []*lane
	shared []*lane
	opened int
	locks  map[string]lockRow
	lines  map[string]map[string]task.LockLine // lock key → task key → place
	docs   map[string]map[string]task.Document // namespace → id → document
	// terms index docs: namespace → term → ids of the documents
	// carrying it, changed with docs under mu.
	terms   map[string]map[string]map[string]struct{}
	workers map[string]task.WorkerInfo
	// workerIDs are the keys of workers in order, so that listing a
	// thousand workers does not sort them on every heartbeat.
	workerIDs []string

	total counters
}

type change struct {
	seq int64
	at  time.Time  // when it was written
	doc *task.Task // the task the write stored; nil for a document write
	// quiet is doc.Quiet(): streams with SkipQuiet pass the change
	// without waking for it.
	quiet bool
	// document is the document a document write stored (its names alone
	// when deleted).
	document *task.Document
	deleted  bool
}

// key is the task key or document id a change is about, for Latency and
// Fault.
func (c change) key() string {
	if c.doc != nil {
		return c.doc.Key
	}
	return c.document.ID
}

type lockRow struct {
	holder task.Holder
	until  time.Time
}

// New returns an empty database.
func New(cfg Config) *DB {
	if cfg.Retention <= 0 {
		cfg.Retention = 1 << 20
	}
	return &DB{cfg: cfg, tasks: map[string]*task.Task{}, open: map[string]*task.Task{},
		locks: map[string]lockRow{}, lines: map[string]map[string]task.LockLine{},
		docs:    map[string]map[string]task.Document{},
		terms:   map[string]map[string]map[string]struct{}{},
		workers: map[string]task.WorkerInfo{}}
}

// Open returns a new handle on db.
func (db *DB) Open() *Store {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.opened++
	return &Store{db: db, index: db.opened - 1, closed: make(chan struct{})}
}

// Counts is what every handle of db did together.
func (db *DB) Counts() Counts { return db.total.snapshot() }

// Tasks returns a copy of every stored task, in seq order: for checking
// invariants after a run.
func (db *DB) Tasks() []*task.Task {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := make([]*task.Task, 0, len(db.tasks))
	for _, t := range db.tasks {
		out = append(out, t.Clone())
	}
	slices.SortFunc(out, func(a, b *task.Task) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// Unfinished counts the stored tasks not in a finished state: a run
// polls it to know when it is done without copying every task.
func (db *DB) Unfinished() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return len(db.open)
}

// put stores t as the task of its key, in the open index while it is
// unfinished. db.mu held.
func (db *DB) put(t *task.Task) {
	db.tasks[t.Key] = t
	if t.State.Finished() {
		delete(db.open, t.Key)
	} else {
		db.open[t.Key] = t
	}
}

// Store is one handle on a DB; it implements task.Store.
type Store struct {
	db        *DB
	index     int   // the handles of db opened before it
	lane      *lane // its streams' delivery schedule, from its first Watch
	closeOnce sync.Once
	closed    chan struct{}
	cut       atomic.Bool
	n         counters
}

var _ task.Store = (*Store)(nil)

// Counts is what this handle did since it was opened.
func (s *Store) Counts() Counts { return s.n.snapshot() }

// DB is the database this handle is on.
func (s *Store) DB() *DB { return s.db }

// enter waits the call's latency and returns its injected fault, or an
// error when the handle is closed or ctx done.
func (s *Store) enter(ctx context.Context, op Op, key string) (Fault, error) {
	if err := s.alive(ctx); err != nil {
		return Fault{}, err
	}
	if s.db.cfg.Latency != nil {
		if d := s.db.cfg.Latency(op, key); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return Fault{}, ctx.Err()
			case <-s.closed:
				t.Stop()
				return Fault{}, task.ErrClosed
			}
		}
	}
	if s.db.cfg.Fault != nil {
		if f := s.db.cfg.Fault(op, key); f.Err != nil {
			if !f.Applied {
				return Fault{}, f.Err
			}
			return f, nil
		}
	}
	return Fault{}, nil
}

// Cut fails every later call of this handle with ErrInjected and ends
// its streams, as a process that died or lost the network would see: its
// leases and registration lapse on their own, nothing is released.
func (s *Store) Cut() {
	s.cut.Store(true)
	s.Close()
}

func (s *Store) alive(ctx context.Context) error {
	if s.cut.Load() {
		return ErrInjected
	}
	select {
	case <-s.closed:
		return task.ErrClosed
	default:
	}
	return ctx.Err()
}

// Now is time.Now: virtual time inside a synctest bubble.
func (s *Store) Now() time.Time { return time.Now().UTC() }

// Close ends this handle's streams; other handles go on.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.db.mu.Lock()
		defer s.db.mu.Unlock()
		if s.lane != nil && s.db.cfg.Lanes == 0 {
			s.db.lanes = slices.DeleteFunc(s.db.lanes, func(l *lane) bool { return l == s.lane })
		}
	})
	return nil
}

// appendChange records doc as written. db.mu held.
func (db *DB) appendChange(doc *task.Task) { db.record(change{doc: doc, quiet: doc.Quiet()}) }

// record appends c to the change history and sends it down every lane.
// db.mu held.
func (db *DB) record(c change) {
	seq := db.dropped + int64(len(db.changes)) + 1
	c.seq, c.at = seq, time.Now()
	db.changes = append(db.changes, c)
	if over := len(db.changes) - db.cfg.Retention; over > 0 {
		db.changes = slices.Delete(db.changes, 0, over)
		db.dropped += int64(over)
	}
	for _, l := range db.lanes {
		db.send(l, c)
	}
}

// Insert stores t unless its key exists; see task.Store.
func (s *Store) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	if err := task.CheckInsertKey(ctx, t.Key); err != nil {
		return nil, false, err
	}
	if err := task.ValidateStoredPayload(t.Payload); err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	f, err := s.enter(ctx, OpInsert, t.Key)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if old, ok := db.tasks[t.Key]; ok {
		return old.Clone(), false, f.Err
	}
	db.nextSeq++
	t.Seq, t.ID, t.Version = db.nextSeq, strconv.FormatInt(db.nextSeq, 10), 1
	stored := t.Clone()
	db.put(stored)
	db.appendChange(stored)
	s.n.writes.Add(1)
	db.total.writes.Add(1)
	if f.Err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, f.Err)
	}
	return t, true, nil
}

// Get returns the task with key or task.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (*task.Task, error) {
	if _, err := s.enter(ctx, OpGet, key); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	s.n.reads.Add(1)
	s.db.total.reads.Add(1)
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	t, ok := s.db.tasks[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, task.ErrNotFound)
	}
	return t.Clone(), nil
}

// Update writes t if the stored version is t.Version; see task.Store.
func (s *Store) Update(ctx context.Context, t *task.Task) error {
	if err := task.ValidateStoredPayload(t.Payload); err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	f, err := s.enter(ctx, OpUpdate, t.Key)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	old, ok := db.tasks[t.Key]
	switch {
	case !ok:
		return fmt.Errorf("update %s: %w", t.Key, task.ErrNotFound)
	case old.Version != t.Version:
		s.n.conflicts.Add(1)
		db.total.conflicts.Add(1)
		return fmt.Errorf("update %s: version %d: %w", t.Key, t.Version, task.ErrConflict)
	}
	stored := t.Clone()
	stored.Version = t.Version + 1
	stored.Seq, stored.ID = old.Seq, old.ID
	db.put(stored)
	db.appendChange(stored)
	s.n.writes.Add(1)
	db.total.writes.Add(1)
	if f.Err != nil {
		return fmt.Errorf("update %s: %w", t.Key, f.Err)
	}
	t.Version = stored.Version
	return nil
}

// Candidates returns one page of unfinished tasks; see task.CandidateQuery.
func (s *Store) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("candidates: limit: %w: must be at least 1", task.ErrInvalid)
	}
	if _, err := s.enter(ctx, OpCandidates, ""); err != nil {
		return nil, fmt.Errorf("candidates: %w", err)
	}
	s.n.reads.Add(1)
	s.db.total.reads.Add(1)
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	var share *[task.ShareBuckets]bool
	if len(q.Share) > 0 {
		share = new([task.ShareBuckets]bool)
		for _, b := range q.Share {
			if b >= 0 && b < task.ShareBuckets {
				share[b] = true
			}
		}
	}
	// The best Limit matches, kept sorted: a page costs one pass.
	var page []*task.Task
	for _, t := range s.db.open {
		switch {
		case len(q.Kinds) > 0 && !slices.Contains(q.Kinds, t.Kind),
			q.WorkerID != "" && !t.Allows(q.WorkerID),
			q.Group != "" && t.Group != q.Group,
			share != nil && len(t.SpecificWorkerIDs) == 0 && !share[task.ShareBucket(t.Seq)],
			q.Ready == t.NextClaimAt.After(q.Now),
			q.After != nil && !q.Less(q.After, t):
			continue
		}
		if len(page) == q.Limit && !q.Less(t, page[len(page)-1]) {
			continue
		}
		i, _ := slices.BinarySearchFunc(page, t, func(a, b *task.Task) int {
			if q.Less(a, b) {
				return -1
			}
			return 1
		})
		page = slices.Insert(page, i, t)
		if len(page) > q.Limit {
			page = page[:q.Limit]
		}
	}
	for i, t := range page {
		page[i] = t.Clone()
	}
	s.n.rows.Add(int64(len(page)))
	s.db.total.rows.Add(int64(len(page)))
	return page, nil
}

// List returns one page of tasks for admin tools; see task.ListQuery.
func (s *Store) List(ctx context.Context, q task.ListQuery) ([]*task.Task, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	if _, err := s.enter(ctx, OpList, ""); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	s.db.mu.Lock()
	var out []*task.Task
	for _, t := range s.db.tasks {
		if t.Seq > q.AfterSeq && (q.BeforeSeq == 0 || t.Seq < q.BeforeSeq) && q.Matches(t) {
			out = append(out, t)
		}
	}
	s.db.mu.Unlock()
	slices.SortFunc(out, func(a, b *task.Task) int {
		if q.Desc {
			return cmp.Compare(b.Seq, a.Seq)
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	for i, t := range out {
		out[i] = t.Clone()
	}
	return out, nil
}

// Stats counts the tasks by state and kind; see task.Store.
func (s *Store) Stats(ctx context.Context) (task.Stats, error) {
	if _, err := s.enter(ctx, OpStats, ""); err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", err)
	}
	now := s.Now()
	type sk struct {
		state task.State
		kind  string
	}
	n := map[sk]int64{}
	var st task.Stats
	s.db.mu.Lock()
	for _, t := range s.db.tasks {
		if task.Reserved(t.Key) {
			continue
		}
		n[sk{t.State, t.Kind}]++
		if t.State == task.StatePending && !t.NextClaimAt.After(now) && (st.OldestReadyAt.IsZero() || t.NextClaimAt.Before(st.OldestReadyAt)) {
			st.OldestReadyAt = t.NextClaimAt
		}
	}
	s.db.mu.Unlock()
	for k, c := range n {
		st.Counts = append(st.Counts, task.StateCount{State: k.state, Kind: k.kind, N: c})
	}
	slices.SortFunc(st.Counts, func(a, b task.StateCount) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.State, b.State))
	})
	return st, nil
}

// DeleteFinished deletes old finished tasks; see task.Store.
func (s *Store) DeleteFinished(ctx context.Context, p task.DeleteParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, fmt.Errorf("delete finished: %w", err)
	}
	if _, err := s.enter(ctx, OpDelete, ""); err != nil {
		return 0, fmt.Errorf("delete finished: %w", err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	var old []*task.Task
	for _, t := range db.tasks {
		if t.State == p.State && t.UpdatedAt.Before(p.Before) {
			old = append(old, t)
		}
	}
	slices.SortFunc(old, func(a, b *task.Task) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), cmp.Compare(a.Seq, b.Seq))
	})
	if len(old) > p.Limit {
		old = old[:p.Limit]
	}
	for _, t := range old {
		delete(db.tasks, t.Key)
	}
	return len(old), nil
}
