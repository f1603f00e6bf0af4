package sqlitestore

// Deletes: finished tasks past their retention.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// oldFinished finds candidates, oldest first, through the partial index
// tasks_finished_updated, on the read connections so that it never holds
// the write lock; the delete then checks state and age again on those
// rows, inside the writer's transaction, so what it deletes is still old
// and finished.
var (
	oldFinished = `SELECT seq FROM tasks WHERE state = ? AND updated_at < ? AND ` + finished + ` ORDER BY updated_at LIMIT ?`
	deleteIfOld = `DELETE FROM tasks WHERE state = ? AND updated_at < ? AND seq IN (`
)

// DeleteFinished deletes old finished tasks; see task.Store. No change
// event is written: a deleted task was finished, so no worker waits on it.
func (s *Store) DeleteFinished(ctx context.Context, p task.DeleteParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	before := p.Before.UnixNano()
	rows, err := s.rdb.QueryContext(ctx, oldFinished, string(p.State), before, p.Limit)
	if err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, mapErr(err))
	}
	args := []any{string(p.State), before}
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			rows.Close()
			return 0, fmt.Errorf("delete %s tasks: %w", p.State, mapErr(err))
		}
		args = append(args, seq)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, mapErr(err))
	}
	if len(args) == 2 {
		return 0, nil
	}
	q := deleteIfOld + strings.Repeat("?,", len(args)-3) + "?) RETURNING kind"
	var n int64
	req := &writeReq{ctx: ctx, savepoint: true}
	req.fn = func(ctx context.Context, tx *sql.Tx) (int64, error) {
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return 0, mapErr(err)
		}
		defer rows.Close()
		for rows.Next() {
			var kind string
			if err := rows.Scan(&kind); err != nil {
				return 0, mapErr(err)
			}
			n++
			req.counts = append(req.counts, countMove{kind, p.State, -1})
		}
		return 0, mapErr(rows.Err())
	}
	if err := s.submit(req); err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, err)
	}
	return int(n), nil
}
