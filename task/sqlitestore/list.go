// list.go is the admin queries: List with its filters and seq paging, and
// Stats.

package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// List returns one page of tasks; see task.ListQuery. State and kind are
// seeks on the indexes that keep seq order (listIndexes); the other
// filters are checked on the rows those yield, in seq order.
func (s *Store) List(ctx context.Context, q task.ListQuery) ([]*task.Task, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	narrow := false
	if q.KeyPrefix != "" {
		var err error
		if narrow, err = s.fewKeys(ctx, q.KeyPrefix); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
	}
	index := ""
	if q.State != "" && q.Kind != "" && !narrow && s.readVersion >= 9 {
		var err error
		if index, err = s.narrower(ctx, q.Kind, q.State); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
	}
	stmt, args := listSQL(q, narrow, index)
	ts, err := s.query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return ts, nil
}

// narrower returns the list index to walk for tasks of kind in state:
// the one by state or the one by kind, whichever holds fewer entries by
// task_counts (the other filter is tested on each row walked).
func (s *Store) narrower(ctx context.Context, kind string, state task.State) (string, error) {
	var inState, ofKind int64
	err := s.rdb.QueryRowContext(ctx, `SELECT (SELECT COALESCE(SUM(n), 0) FROM task_counts WHERE state = ?),
		(SELECT COALESCE(SUM(n), 0) FROM task_counts WHERE kind = ?)`, string(state), kind).Scan(&inState, &ofKind)
	if err != nil {
		return "", mapErr(err)
	}
	if inState <= ofKind {
		return "tasks_state_seq", nil
	}
	return "tasks_kind_seq", nil
}

// narrowPrefix is how many keys a prefix may match for List to read them
// through the key index (their seqs gathered, then walked in order),
// rather than walk seq order testing each row's key. Gathering a seq from
// the key index costs a fraction of a row read, which is what a seq walk
// past a rare or clustered prefix pays for every task it skips; at this
// bound the gathering stays cheaper than such a walk over a large store.
var narrowPrefix = 100_000

// fewKeys reports whether at most narrowPrefix keys start with prefix,
// counted on the key index alone (and no further than narrowPrefix+1).
func (s *Store) fewKeys(ctx context.Context, prefix string) (bool, error) {
	if s.closed.Load() {
		return false, errClosed
	}
	var n int
	err := s.rdb.QueryRowContext(ctx, "SELECT count(*) FROM (SELECT 1 FROM tasks WHERE key >= ? AND key < ? LIMIT ?)",
		prefix, prefixEnd(prefix), narrowPrefix+1).Scan(&n)
	return n <= narrowPrefix, mapErr(err)
}

// prefixEnd is the least string above every string starting with p (keys
// are valid UTF-8, so p's last byte is below 0xff).
func prefixEnd(p string) string {
	b := []byte(p)
	b[len(b)-1]++
	return string(b)
}

// listSQL builds List's query; narrow reads the key prefix's rows through
// the key index (few of them) instead of filtering rows in seq order, and
// index, when set, is the index to walk.
func listSQL(q task.ListQuery, narrow bool, index string) (string, []any) {
	var b strings.Builder
	lo, hi := task.ReservedRange()
	args := []any{q.AfterSeq, lo, hi}
	b.WriteString("SELECT seq, version, doc FROM tasks ")
	if index != "" {
		b.WriteString("INDEXED BY " + index + " ")
	}
	// The reserved range is tested on key, not with the key index: it
	// holds a document or two, so it must never drive the plan.
	if q.Reserved {
		b.WriteString("WHERE seq > ? AND (+key >= ? AND +key < ?)")
	} else {
		b.WriteString("WHERE seq > ? AND NOT (+key >= ? AND +key < ?)")
	}
	and := func(cond string, a ...any) {
		b.WriteString(" AND " + cond)
		args = append(args, a...)
	}
	if q.BeforeSeq > 0 {
		and("seq < ?", q.BeforeSeq)
	}
	if q.State != "" {
		and("state = ?", string(q.State))
	}
	if q.Kind != "" {
		and("kind = ?", q.Kind)
	}
	if q.KeyPrefix != "" {
		if narrow {
			and("seq IN (SELECT seq FROM tasks WHERE key >= ? AND key < ?)", q.KeyPrefix, prefixEnd(q.KeyPrefix))
		}
		// substr, not LIKE: a prefix holding % or _ means itself. The
		// unary + keeps a common prefix's walk in seq order.
		and("substr(+key, 1, ?) = ?", len([]rune(q.KeyPrefix)), q.KeyPrefix)
	}
	// The worker and text filters parse each row's document; a plain
	// substring test of the raw document first (a necessary condition)
	// skips that parse for nearly every row that cannot match.
	if q.WorkerID != "" {
		if plain(q.WorkerID) {
			and("instr(doc, ?) > 0", `"worker_id":"`+q.WorkerID+`"`)
		}
		and("EXISTS (SELECT 1 FROM json_each(doc, '$.workers') WHERE json_extract(value, '$.worker_id') = ?)", q.WorkerID)
	}
	if q.Text != "" {
		if plain(q.Text) {
			and("instr(doc, ?) > 0", q.Text)
		}
		and("instr(json_extract(doc, '$.payload'), ?) > 0", q.Text)
	}
	times := []struct {
		field, op string
		at        time.Time
	}{
		{"created_at", ">", q.CreatedAfter}, {"created_at", "<", q.CreatedBefore},
		{"updated_at", ">", q.UpdatedAfter}, {"updated_at", "<", q.UpdatedBefore},
	}
	for _, c := range times {
		if c.at.IsZero() {
			continue
		}
		// Whole milliseconds, truncated, as task.ListQuery documents (and
		// MongoDB stores). SQLite rounds fractions to the nearest
		// millisecond, so the digits past them are cut first: the stored
		// times are UTC RFC 3339 ("…:SS.fffffffffZ"), and without its Z a
		// time reads as UTC.
		and("CAST(round(unixepoch(substr(json_extract(doc, '$."+c.field+"'), 1, 23), 'subsec') * 1000) AS INTEGER) "+c.op+" ?", c.at.UnixMilli())
	}
	if q.Desc {
		b.WriteString(" ORDER BY seq DESC")
	} else {
		b.WriteString(" ORDER BY seq")
	}
	limit := q.Limit
	if limit <= 0 {
		limit = -1
	}
	b.WriteString(" LIMIT ?")
	args = append(args, limit)
	return b.String(), args
}

// plain reports whether s appears in a stored document exactly as JSON
// text holds it: printable ASCII that encoding/json never escapes (it
// escapes <, > and & as \u003c…).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// Stats reads the counts of tasks by state and kind from task_counts,
// minus the reserved documents (found on the key index), and finds the
// oldest ready pending task (oldestReady).
func (s *Store) Stats(ctx context.Context) (task.Stats, error) {
	if s.closed.Load() {
		return task.Stats{}, errClosed
	}
	lo, hi := task.ReservedRange()
	countAll := "SELECT state, kind, n FROM task_counts"
	if s.readVersion < 9 { // a read-only look at a file from before task_counts
		countAll = "SELECT state, kind, COUNT(*) FROM tasks GROUP BY kind, state"
	}
	all, err := s.counts(ctx, countAll)
	if err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", err)
	}
	reserved, err := s.counts(ctx, "SELECT state, kind, COUNT(*) FROM tasks WHERE key >= ? AND key < ? GROUP BY kind, state", lo, hi)
	if err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", err)
	}
	var st task.Stats
	for _, c := range all {
		for _, r := range reserved {
			if r.State == c.State && r.Kind == c.Kind {
				c.N -= r.N
			}
		}
		if c.N > 0 {
			st.Counts = append(st.Counts, c)
		}
	}
	at, err := s.oldestReady(ctx)
	if err != nil {
		return task.Stats{}, fmt.Errorf("stats: oldest ready: %w", err)
	}
	if at.Valid {
		st.OldestReadyAt = time.Unix(0, at.Int64).UTC()
	}
	return st, nil
}

// oldestReady returns the earliest claim time of a ready pending task:
// the earliest of each priority's first ready pending task in tasks_ready.
func (s *Store) oldestReady(ctx context.Context) (sql.NullInt64, error) {
	var oldest sql.NullInt64
	lo, hi := task.ReservedRange()
	now, pending := s.Now().UnixNano(), string(task.StatePending)
	tx, err := s.rdb.BeginTx(ctx, nil)
	if err != nil {
		return oldest, mapErr(err)
	}
	defer tx.Rollback()
	first := func(row *sql.Row) (bool, error) {
		var at int64
		err := row.Scan(&at)
		if errors.Is(err, sql.ErrNoRows) {
			return true, nil
		}
		if err == nil && (!oldest.Valid || at < oldest.Int64) {
			oldest = sql.NullInt64{Int64: at, Valid: true}
		}
		return true, mapErr(err)
	}
	if s.readVersion < 8 { // a read-only look at a file from before tasks_ready
		_, err := first(tx.QueryRowContext(ctx, `SELECT next_claim_at FROM tasks WHERE state = ? AND next_claim_at <= ?
			AND NOT (+key >= ? AND +key < ?) ORDER BY next_claim_at LIMIT 1`, pending, now, lo, hi))
		return oldest, err
	}
	st, err := tx.PrepareContext(ctx, `SELECT next_claim_at FROM tasks INDEXED BY tasks_ready WHERE `+unfinished+` AND priority = ?
		AND next_claim_at <= ? AND state = ? AND NOT (+key >= ? AND +key < ?) ORDER BY next_claim_at LIMIT 1`)
	if err != nil {
		return oldest, mapErr(err)
	}
	defer st.Close()
	err = eachPriority(ctx, tx, sql.NullInt64{}, func(prio int) (bool, error) {
		return first(st.QueryRowContext(ctx, prio, now, pending, lo, hi))
	})
	return oldest, err
}

func (s *Store) counts(ctx context.Context, q string, args ...any) ([]task.StateCount, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, mapErr(err)
	}
	defer rows.Close()
	var out []task.StateCount
	for rows.Next() {
		var c task.StateCount
		if err := rows.Scan(&c.State, &c.Kind, &c.N); err != nil {
			return nil, mapErr(err)
		}
		out = append(out, c)
	}
	return out, mapErr(rows.Err())
}
