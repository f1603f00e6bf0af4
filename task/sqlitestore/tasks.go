// tasks.go stores and reads tasks: Insert, Get, Update, the candidate
// and list queries, the row encoding, and the cache of documents this
// Store wrote for its own watchers.

package sqlitestore

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
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

// Candidates returns one page of unfinished tasks; see task.CandidateQuery.
func (s *Store) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("%w: candidates: limit must be positive", task.ErrInvalid)
	}
	if s.closed.Load() {
		return nil, fmt.Errorf("candidates: %w", errClosed)
	}
	// One snapshot for the page: its queries see one state of the store.
	tx, err := s.rdb.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("candidates: %w", mapErr(err))
	}
	defer tx.Rollback()
	var ts []*task.Task
	if q.Ready {
		ts, err = readyCandidates(ctx, tx, q)
	} else {
		ts, err = upcomingCandidates(ctx, tx, q)
	}
	if err != nil {
		return nil, fmt.Errorf("candidates: %w", err)
	}
	s.seen.note(ts...) // the versions claims will replace
	return ts, nil
}

// Both candidate orders are read from the one index on unfinished tasks,
// tasks_ready (priority, next_claim_at), one priority at a time: each
// priority's ready or upcoming tasks are a range of it. A second index by
// claim time alone served the upcoming order directly, but every claim
// and finish had to move the task in it too: three b-tree writes a task
// in the writer goroutine.

// readyCandidates reads ready tasks one priority at a time, highest
// first: each priority's page is a range seek in tasks_ready, and the next
// lower priority one index seek, so a page costs the same with ten or a
// million tasks waiting, ready or not. (One query ordered by priority
// would have to collect and sort every ready task.)
func readyCandidates(ctx context.Context, tx *sql.Tx, q task.CandidateQuery) ([]*task.Task, error) {
	var out []*task.Task
	from := sql.NullInt64{}
	if q.After != nil {
		from = sql.NullInt64{Int64: int64(q.After.Priority), Valid: true}
	}
	err := eachPriority(ctx, tx, from, func(prio int) (bool, error) {
		stmt, args := candidateSQL(q, "seq, version, doc", prio, q.Limit-len(out))
		page, err := queryTasks(ctx, tx, stmt, args...)
		out = append(out, page...)
		return len(out) < q.Limit, err
	})
	return out, err
}

// upcomingCandidates reads the tasks waiting for a later claim time, by
// that time across priorities: each priority's earliest positions (claim
// time and seq, from the index and the row's kind and pins, no document)
// are merged, each priority read only up to the page's worst position so
// far, and then the documents of the page's tasks are read. A query costs
// an index seek per priority in use.
func upcomingCandidates(ctx context.Context, tx *sql.Tx, q task.CandidateQuery) ([]*task.Task, error) {
	type position struct{ at, seq int64 }
	var best []position
	text, args := candidateSQL(q, "next_claim_at, seq", 0, q.Limit)
	text = strings.Replace(text, " ORDER BY", " AND (next_claim_at < ? OR (next_claim_at = ? AND seq < ?)) ORDER BY", 1)
	bound := len(args) - 1 // the three arguments before the limit
	args = slices.Insert(args, bound, any(nil), any(nil), any(nil))
	st, err := tx.PrepareContext(ctx, text)
	if err != nil {
		return nil, mapErr(err)
	}
	defer st.Close()
	err = eachPriority(ctx, tx, sql.NullInt64{}, func(prio int) (bool, error) {
		worst := position{math.MaxInt64, math.MaxInt64}
		if len(best) == q.Limit {
			worst = best[len(best)-1]
		}
		args[0], args[bound], args[bound+1], args[bound+2] = prio, worst.at, worst.at, worst.seq
		rows, err := st.QueryContext(ctx, args...)
		if err != nil {
			return false, mapErr(err)
		}
		defer rows.Close()
		for rows.Next() {
			var p position
			if err := rows.Scan(&p.at, &p.seq); err != nil {
				return false, mapErr(err)
			}
			best = append(best, p)
		}
		slices.SortFunc(best, func(a, b position) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq)) })
		best = best[:min(len(best), q.Limit)]
		return true, mapErr(rows.Err())
	})
	if err != nil || len(best) == 0 {
		return nil, err
	}
	seqs := make([]byte, 0, 12*len(best))
	rank := make(map[int64]int, len(best))
	for i, p := range best {
		seqs = strconv.AppendInt(append(seqs, ','), p.seq, 10)
		rank[p.seq] = i
	}
	seqs[0] = '['
	out, err := queryTasks(ctx, tx, "SELECT seq, version, doc FROM tasks WHERE seq IN (SELECT value FROM json_each(?))", string(append(seqs, ']')))
	slices.SortFunc(out, func(a, b *task.Task) int { return rank[a.Seq] - rank[b.Seq] })
	return out, err
}

// eachPriority calls fn with each priority of an unfinished task, highest
// first, starting at from when set, while fn returns true. Each step is
// one seek in tasks_ready.
func eachPriority(ctx context.Context, tx *sql.Tx, from sql.NullInt64, fn func(prio int) (bool, error)) error {
	var err error
	prio := from
	if !prio.Valid {
		err = tx.QueryRowContext(ctx, `SELECT MAX(priority) FROM tasks INDEXED BY tasks_ready WHERE `+unfinished).Scan(&prio)
	}
	var below *sql.Stmt
	for err == nil && prio.Valid {
		var more bool
		if more, err = fn(int(prio.Int64)); err != nil || !more {
			break
		}
		if below == nil {
			if below, err = tx.PrepareContext(ctx, `SELECT MAX(priority) FROM tasks INDEXED BY tasks_ready WHERE `+unfinished+` AND priority < ?`); err != nil {
				break
			}
			defer below.Close()
		}
		err = below.QueryRowContext(ctx, prio.Int64).Scan(&prio)
	}
	return mapErr(err)
}

// candidateSQL builds a query of cols over one priority's ready tasks, or
// its upcoming ones, by next claim time, each page after q.After.
func candidateSQL(q task.CandidateQuery, cols string, priority, limit int) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, 8)
	// INDEXED BY: without statistics the planner prefers the index on
	// state, which reads every unfinished task and sorts them.
	b.WriteString("SELECT " + cols + " FROM tasks INDEXED BY tasks_ready WHERE " + unfinished + " AND priority = ?")
	args = append(args, priority)
	now := q.Now.UnixNano()
	if q.Ready {
		b.WriteString(" AND next_claim_at <= ?")
	} else {
		b.WriteString(" AND next_claim_at > ?")
	}
	args = append(args, now)
	if len(q.Kinds) > 0 {
		b.WriteString(" AND kind IN (?" + strings.Repeat(", ?", len(q.Kinds)-1) + ")")
		for _, k := range q.Kinds {
			args = append(args, k)
		}
	}
	if q.WorkerID != "" {
		b.WriteString(" AND (pinned = '' OR EXISTS (SELECT 1 FROM json_each(pinned) WHERE value = ?))")
		args = append(args, q.WorkerID)
	}
	if len(q.Share) > 0 {
		b.WriteString(" AND (pinned != '' OR " + shareBucketSQL + " IN (SELECT value FROM json_each(?)))")
		args = append(args, shareJSON(q.Share))
	}
	if a := q.After; a != nil && (!q.Ready || a.Priority == priority) {
		n := nanos(a.NextClaimAt)
		b.WriteString(" AND (next_claim_at > ? OR (next_claim_at = ? AND seq > ?))")
		args = append(args, n, n, a.Seq)
	}
	b.WriteString(" ORDER BY next_claim_at ASC, seq ASC LIMIT ?")
	args = append(args, limit)
	return b.String(), args
}

// shareBucketSQL is task.ShareBucket of a row's seq (positive, so >> is
// the same shift as Go's; SQLite has no XOR: a ^ b = (a | b) - (a & b)).
var shareBucketSQL = func() string {
	xor := func(a, b string) string { return "((" + a + " | " + b + ") - (" + a + " & " + b + "))" }
	return "(" + xor(xor("seq", "(seq >> 12)"), "(seq >> 24)") + " & " + strconv.Itoa(task.ShareBuckets-1) + ")"
}()

// shareJSON is share as a JSON array, for json_each.
func shareJSON(share []int) string {
	b := make([]byte, 0, 5*len(share)+2)
	b = append(b, '[')
	for i, n := range share {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return string(append(b, ']'))
}

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
