package sqlitestore

// Deletes: finished tasks past their retention, and shared records.

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/leasepool/leasepool/task"
)

var _ task.RecordDeleter = (*Store)(nil)

// deleteFinished selects and deletes in one statement inside the writer's
// transaction, so the state and age checked are those of the row deleted.
// updated_at lives in the JSON document; unixepoch(..., 'subsec') reads
// its RFC 3339 text (string order would misplace fractional seconds).
const deleteFinished = `DELETE FROM tasks WHERE seq IN (
	SELECT seq FROM tasks
	WHERE state = ? AND unixepoch(json_extract(doc, '$.updated_at'), 'subsec') < ?
	ORDER BY seq LIMIT ?)`

// DeleteFinished deletes old finished tasks; see task.Store. No change
// event is written: a deleted task was finished, so no worker waits on it.
func (s *Store) DeleteFinished(ctx context.Context, p task.DeleteParams) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	before := float64(p.Before.UnixNano()) / 1e9
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) (int64, error) {
		res, err := tx.ExecContext(ctx, deleteFinished, string(p.State), before, p.Limit)
		if err != nil {
			return 0, mapErr(err)
		}
		n, err = res.RowsAffected()
		return 0, mapErr(err)
	})
	if err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, err)
	}
	return int(n), nil
}

// DeleteRecord deletes one shared record; see task.RecordDeleter.
func (s *Store) DeleteRecord(ctx context.Context, kind, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) (int64, error) {
		_, err := tx.ExecContext(ctx, `DELETE FROM records WHERE kind = ? AND id = ?`, kind, id)
		return 0, mapErr(err)
	})
	if err != nil {
		return fmt.Errorf("delete record %s/%s: %w", kind, id, err)
	}
	return nil
}
