// tasks.go stores and reads tasks: Insert, Get, Update, the candidate
// and list queries, the row encoding, and the cache of documents this
// Store wrote for its own watchers.

package sqlitestore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// nanos stores a time as unix nanoseconds; the zero time is 0.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func pinned(t *task.Task) (string, error) {
	if len(t.SpecificWorkerIDs) == 0 {
		return "", nil
	}
	b, err := json.Marshal(t.SpecificWorkerIDs)
	return string(b), err
}

// decode reads a stored row: the doc plus the columns that own ID, Seq and
// Version.
func decode(seq, version int64, doc string) (*task.Task, error) {
	t, err := parseJSON([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: decode task seq %d: %w", seq, err)
	}
	t.ID = strconv.FormatInt(seq, 10)
	t.Seq = seq
	t.Version = version
	return t, nil
}

type rowScanner interface{ Scan(dest ...any) error }

func scanTask(r rowScanner) (*task.Task, error) {
	var seq, version int64
	var doc string
	if err := r.Scan(&seq, &version, &doc); err != nil {
		return nil, err
	}
	return decode(seq, version, doc)
}

// Insert stores t unless its key exists; see task.Store.
func (s *Store) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	op, err := s.newInsert(ctx, t)
	if err != nil {
		return nil, false, err
	}
	req := &writeReq{ctx: ctx, onCommit: op.committed}
	req.fn = func(ctx context.Context, tx *sql.Tx) (int64, error) { return op.run(ctx, tx, req) }
	if err := s.submit(req); err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	return op.stored, op.inserted, nil
}

// insertOp is one Insert's write: checked and encoded in the caller's
// goroutine by newInsert, run by the writer (or in a Tx), then noted by
// committed once its transaction committed.
type insertOp struct {
	s         *Store
	t         *task.Task
	pin, doc  string
	changeDoc string
	kept      *task.Task

	stored   *task.Task
	inserted bool
	change   int64
}

func (s *Store) newInsert(ctx context.Context, t *task.Task) (*insertOp, error) {
	if err := task.CheckInsertKey(ctx, t.Key); err != nil {
		return nil, err
	}
	if err := task.ValidateStoredPayload(t.Payload); err != nil {
		return nil, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	pin, err := pinned(t)
	if err != nil {
		return nil, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	c := *t
	c.Version = 1
	changeDoc, doc, err := encode(&c)
	if err != nil {
		return nil, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	// kept is cloned here, not in the one writer goroutine.
	return &insertOp{s: s, t: t, pin: pin, doc: doc, changeDoc: changeDoc, kept: c.Clone()}, nil
}

// run inserts the task in tx, adding its count move to req.
func (op *insertOp) run(ctx context.Context, tx *sql.Tx, req *writeReq) (int64, error) {
	s, t := op.s, op.t
	var seq int64
	err := s.txStmt(tx, s.insTask).QueryRowContext(ctx,
		t.Key, t.Kind, string(t.State), nanos(t.NextClaimAt), t.Priority, op.pin, op.doc, nanos(t.UpdatedAt)).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		op.stored, err = scanTask(tx.StmtContext(ctx, s.selTaskW).QueryRowContext(ctx, t.Key))
		return 0, mapErr(err)
	}
	if err != nil {
		return 0, mapErr(err)
	}
	op.inserted = true
	op.stored = t
	t.ID, t.Seq, t.Version = strconv.FormatInt(seq, 10), seq, 1
	op.kept.ID, op.kept.Seq = t.ID, seq
	req.counts = append(req.counts, countMove{t.Kind, t.State, 1})
	op.change, err = s.appendChange(ctx, tx, t.Key, op.changeDoc)
	return op.change, err
}

// committed notes the inserted document for this Store's watchers and
// count moves, once its transaction committed.
func (op *insertOp) committed() {
	if op.inserted {
		op.s.remember(op.change, op.kept)
		op.s.seen.note(op.kept)
	}
}

// Get returns the task with key or task.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (*task.Task, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	t, err := scanTask(s.selTask.QueryRowContext(ctx, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("get %s: %w", key, task.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, mapErr(err))
	}
	s.seen.note(t)
	return t, nil
}

// Update writes t if the stored version is t.Version; see task.Store.
func (s *Store) Update(ctx context.Context, t *task.Task) error {
	op, err := s.newUpdate(t)
	if err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, onCommit: op.committed}
	req.fn = func(ctx context.Context, tx *sql.Tx) (int64, error) { return op.run(ctx, tx, req) }
	if err := s.submit(req); err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	t.Version = op.next
	return nil
}

// updateOp is one Update's write, as insertOp is an Insert's.
type updateOp struct {
	s         *Store
	t         *task.Task
	next      int64 // the version written
	pin, doc  string
	changeDoc string
	updatedAt int64
	kept      *task.Task

	change int64
	bySeq  bool // the row written is the one t.Seq names
}

func (s *Store) newUpdate(t *task.Task) (*updateOp, error) {
	if err := task.ValidateStoredPayload(t.Payload); err != nil {
		return nil, fmt.Errorf("update %s: %w", t.Key, err)
	}
	pin, err := pinned(t)
	if err != nil {
		return nil, fmt.Errorf("update %s: %w", t.Key, err)
	}
	next := t.Version + 1
	// The doc carries the new version so that readers of the doc alone agree.
	c := *t
	c.Version = next
	changeDoc, doc, err := encode(&c)
	if err != nil {
		return nil, fmt.Errorf("update %s: %w", t.Key, err)
	}
	// kept is cloned here, not in the one writer goroutine.
	return &updateOp{s: s, t: t, next: next, pin: pin, doc: doc, changeDoc: changeDoc,
		updatedAt: nanos(c.UpdatedAt), kept: c.Clone()}, nil
}

// run writes the update in tx, adding its count moves to req.
func (op *updateOp) run(ctx context.Context, tx *sql.Tx, req *writeReq) (int64, error) {
	s, t, pin, doc := op.s, op.t, op.pin, op.doc
	// What the write moves in task_counts: the replaced version's kind
	// and state, known when this Store saw that version.
	kind, state, known := s.seen.lookup(t.Seq, t.Version)
	var err error
	if !known {
		if kind, state, known, err = s.readStored(ctx, tx, t.Key, t.Version); err != nil {
			return 0, err
		}
	}
	// Most writes keep kind, priority and pins: the narrow statement
	// then leaves their indexes alone, and finds the row by its rowid
	// (seq), not through the key index. Both are conditional on the
	// version, so a write that changes them (or a document without its
	// seq) simply takes the second.
	res, err := s.txStmt(tx, s.updHot).ExecContext(ctx,
		string(t.State), nanos(t.NextClaimAt), doc, op.updatedAt, t.Seq, t.Key, t.Version, t.Kind, t.Priority, pin)
	n, _ := rowsAffected(res, err)
	op.bySeq = err == nil && n == 1
	if err == nil && n == 0 {
		// The row by key, which need not be the version seen by seq.
		if kind, state, known, err = s.readStored(ctx, tx, t.Key, t.Version); err != nil {
			return 0, err
		}
		res, err = s.txStmt(tx, s.updTask).ExecContext(ctx,
			t.Kind, string(t.State), nanos(t.NextClaimAt), t.Priority, pin, doc, op.updatedAt, t.Key, t.Version)
	}
	if n, err := rowsAffected(res, err); err != nil {
		return 0, mapErr(err)
	} else if n == 1 && !known {
		return 0, fmt.Errorf("sqlitestore: updated %s version %d without reading it", t.Key, t.Version)
	} else if n == 0 {
		var one int
		err := tx.StmtContext(ctx, s.existsW).QueryRowContext(ctx, t.Key).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, task.ErrNotFound
		}
		if err != nil {
			return 0, mapErr(err)
		}
		return 0, fmt.Errorf("version %d: %w", t.Version, task.ErrConflict)
	}
	req.moved(kind, state, t.Kind, t.State)
	op.change, err = s.appendChange(ctx, tx, t.Key, op.changeDoc)
	return op.change, err
}

// committed notes the written document for this Store's watchers and
// count moves, once its transaction committed.
func (op *updateOp) committed() {
	op.s.remember(op.change, op.kept)
	if op.bySeq {
		op.s.seen.note(op.kept)
	}
}

func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// encode marshals t once, in the caller's goroutine rather than the
// writer's: change is the document without its payload (a change row's:
// a renewal a second should not copy up to 1 MiB), doc the stored one,
// the same with the payload spliced in as its last field.
func encode(t *task.Task) (change, doc string, err error) {
	c := *t
	c.Payload = nil
	b, err := appendJSON(make([]byte, 0, 1024), &c)
	if err != nil {
		return "", "", err
	}
	if len(t.Payload) == 0 {
		s := string(b)
		return s, s, nil
	}
	var full bytes.Buffer
	full.Grow(len(b) + len(t.Payload) + 12)
	full.Write(b[:len(b)-1])
	full.WriteString(`,"payload":`)
	if err := json.Compact(&full, t.Payload); err != nil {
		return "", "", fmt.Errorf("payload: %w", err)
	}
	full.WriteByte('}')
	return string(b), full.String(), nil
}

var (
	unfinished = `state IN ('` + string(task.StatePending) + `', '` + string(task.StateRunning) + `')`
	finished   = `state NOT IN ('` + string(task.StatePending) + `', '` + string(task.StateRunning) + `')`
)

// queryTasks runs a query of (seq, version, doc) rows.
func queryTasks(ctx context.Context, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string, args ...any) ([]*task.Task, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, mapErr(err)
	}
	defer rows.Close()
	var out []*task.Task
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, mapErr(err)
		}
		out = append(out, t)
	}
	return out, mapErr(rows.Err())
}

func (s *Store) query(ctx context.Context, q string, args ...any) ([]*task.Task, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	return queryTasks(ctx, s.rdb, q, args...)
}

const recentSize = 4096

// remember keeps doc, a copy of the document written as change seq that
// nothing else holds.
func (s *Store) remember(seq int64, doc *task.Task) {
	if seq == 0 {
		return
	}
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	if s.recent == nil {
		s.recent = make(map[int64]*task.Task, recentSize)
	}
	delete(s.recent, s.ring[s.ringPos])
	s.ring[s.ringPos] = seq
	s.ringPos = (s.ringPos + 1) % recentSize
	s.recent[seq] = doc
}

// recalled returns the document this Store wrote as change seq, if kept.
func (s *Store) recalled(seq int64) *task.Task {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	return s.recent[seq]
}

// decodeChange decodes the document a change recorded (everything but the
// payload, as it was after that write) and gives it the current payload.
func decodeChange(seq int64, after string, current sql.NullString) (*task.Task, error) {
	t, err := parseJSON([]byte(after))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: decode change of task seq %d: %w", seq, err)
	}
	if current.Valid {
		cur, err := parseJSON([]byte(current.String))
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: decode task seq %d: %w", seq, err)
		}
		t.Payload = cur.Payload
	}
	t.ID, t.Seq = strconv.FormatInt(seq, 10), seq
	return t, nil
}
