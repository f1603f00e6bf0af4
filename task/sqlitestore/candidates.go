package sqlitestore

// The candidate queries: ready tasks by priority and claim time, upcoming
// ones by claim time, a worker's share of the backlog.

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/leasepool/leasepool/task"
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
	prioArg := 0 // the priority's argument: after the group's, if any
	if q.Group != "" {
		prioArg = 1
	}
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
		args[prioArg], args[bound], args[bound+1], args[bound+2] = prio, worst.at, worst.at, worst.seq
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
	if q.Group != "" {
		// No index on the group: see hotIndexes.
		b.WriteString("SELECT " + cols + " FROM tasks INDEXED BY tasks_ready WHERE " + unfinished + " AND " + groupSQL + " = ? AND priority = ?")
		args = append(args, q.Group, priority)
	} else {
		b.WriteString("SELECT " + cols + " FROM tasks INDEXED BY tasks_ready WHERE " + unfinished + " AND priority = ?")
		args = append(args, priority)
	}
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
