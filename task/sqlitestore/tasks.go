// tasks.go stores and reads tasks: Insert, Get, Update, the candidate
// and list queries, the row encoding, and the cache of documents this
// Store wrote for its own watchers.

package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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
	t := new(task.Task)
	if err := json.Unmarshal([]byte(doc), t); err != nil {
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
	if err := task.ValidateName("key", t.Key); err != nil {
		return nil, false, err
	}
	if err := task.ValidatePayload(t.Payload); err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	pin, err := pinned(t)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	doc, err := json.Marshal(t)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	var stored *task.Task
	var inserted bool
	var change int64
	err = s.submit(&writeReq{ctx: ctx, onCommit: func() {
		if inserted {
			s.remember(change, t)
		}
	}, fn: func(tx *sql.Tx) (int64, error) {
		var seq int64
		err := tx.StmtContext(ctx, s.insTask).QueryRowContext(ctx,
			t.Key, t.Kind, string(t.State), nanos(t.NextClaimAt), t.Priority, pin, string(doc)).Scan(&seq)
		if errors.Is(err, sql.ErrNoRows) {
			stored, err = scanTask(tx.StmtContext(ctx, s.selTaskW).QueryRowContext(ctx, t.Key))
			return 0, mapErr(err)
		}
		if err != nil {
			return 0, mapErr(err)
		}
		inserted = true
		stored = t
		t.ID, t.Seq, t.Version = strconv.FormatInt(seq, 10), seq, 1
		change, err = s.appendChange(ctx, tx, t)
		return change, err
	}})
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	return stored, inserted, nil
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
	return t, nil
}

// Update writes t if the stored version is t.Version; see task.Store.
func (s *Store) Update(ctx context.Context, t *task.Task) error {
	if err := task.ValidatePayload(t.Payload); err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	pin, err := pinned(t)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	next := t.Version + 1
	// The doc carries the new version so that readers of the doc alone agree.
	c := *t
	c.Version = next
	doc, err := json.Marshal(&c)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	var change int64
	err = s.submit(&writeReq{ctx: ctx, onCommit: func() { s.remember(change, &c) }, fn: func(tx *sql.Tx) (int64, error) {
		res, err := tx.StmtContext(ctx, s.updTask).ExecContext(ctx,
			t.Kind, string(t.State), nanos(t.NextClaimAt), t.Priority, pin, string(doc), t.Key, t.Version)
		if err != nil {
			return 0, mapErr(err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return 0, mapErr(err)
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
		change, err = s.appendChange(ctx, tx, &c)
		return change, err
	}})
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	t.Version = next
	return nil
}

var unfinished = `state IN ('` + string(task.StatePending) + `', '` + string(task.StateRunning) + `')`

// Candidates returns one page of unfinished tasks; see task.CandidateQuery.
func (s *Store) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("%w: candidates: limit must be positive", task.ErrInvalid)
	}
	stmt, args := candidateSQL(q)
	ts, err := s.query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("candidates: %w", err)
	}
	return ts, nil
}

// candidateSQL builds the query of Candidates: ready tasks by priority,
// waiting ones by when they become claimable, each page after q.After.
func candidateSQL(q task.CandidateQuery) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, 8)
	b.WriteString("SELECT seq, version, doc FROM tasks WHERE " + unfinished)
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
	if a := q.After; a != nil {
		if q.Ready {
			b.WriteString(" AND (priority < ? OR (priority = ? AND seq > ?))")
			args = append(args, a.Priority, a.Priority, a.Seq)
		} else {
			n := nanos(a.NextClaimAt)
			b.WriteString(" AND (next_claim_at > ? OR (next_claim_at = ? AND seq > ?))")
			args = append(args, n, n, a.Seq)
		}
	}
	if q.Ready {
		b.WriteString(" ORDER BY priority DESC, seq ASC")
	} else {
		b.WriteString(" ORDER BY next_claim_at ASC, seq ASC")
	}
	b.WriteString(" LIMIT ?")
	args = append(args, q.Limit)
	return b.String(), args
}

func (s *Store) query(ctx context.Context, q string, args ...any) ([]*task.Task, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
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

const recentSize = 4096

// remember keeps a copy of the document written as change seq.
func (s *Store) remember(seq int64, t *task.Task) {
	if seq == 0 {
		return
	}
	doc := t.Clone()
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
	t := new(task.Task)
	if err := json.Unmarshal([]byte(after), t); err != nil {
		return nil, fmt.Errorf("sqlitestore: decode change of task seq %d: %w", seq, err)
	}
	if current.Valid {
		var p struct {
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal([]byte(current.String), &p); err != nil {
			return nil, fmt.Errorf("sqlitestore: decode task seq %d: %w", seq, err)
		}
		t.Payload = p.Payload
	}
	t.ID, t.Seq = strconv.FormatInt(seq, 10), seq
	return t, nil
}
