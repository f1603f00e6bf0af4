// records.go keeps the shared records of task.RecordStore, such as
// device states.

package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// PutRecord stores r unless a later one is there; see task.RecordStore.
func (s *Store) PutRecord(ctx context.Context, r task.Record) error {
	if err := task.ValidateName("record kind", r.Kind); err != nil {
		return err
	}
	if err := task.ValidateName("record id", r.ID); err != nil {
		return err
	}
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO records (kind, id, at, value) VALUES (?, ?, ?, ?)
			ON CONFLICT (kind, id) DO UPDATE SET at = excluded.at, value = excluded.value WHERE excluded.at >= records.at`,
			r.Kind, r.ID, nanos(r.At), string(r.Value))
		return 0, mapErr(err)
	})
}

// Records returns every record of kind; see task.RecordStore.
func (s *Store) Records(ctx context.Context, kind string) ([]task.Record, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, at, value FROM records WHERE kind = ? ORDER BY id`, kind)
	if err != nil {
		return nil, fmt.Errorf("records %s: %w", kind, mapErr(err))
	}
	defer rows.Close()
	var out []task.Record
	for rows.Next() {
		r := task.Record{Kind: kind}
		var at int64
		var value string
		if err := rows.Scan(&r.ID, &at, &value); err != nil {
			return nil, fmt.Errorf("records %s: %w", kind, mapErr(err))
		}
		r.At, r.Value = time.Unix(0, at).UTC(), json.RawMessage(value)
		out = append(out, r)
	}
	return out, mapErr(rows.Err())
}
