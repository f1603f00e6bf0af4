package sqlitestore

// The worker registry: one row per worker id, held by the process instance
// whose registration (until) is ahead of store time.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/leasepool/leasepool/task"
)

// RegisterWorker implements task.Registry in one write transaction.
func (s *Store) RegisterWorker(ctx context.Context, p task.RegisterParams) error {
	w := p.Worker
	if err := task.ValidateWorkerInfo(w); err != nil {
		return err
	}
	info, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("register worker %s: %w", w.ID, err)
	}
	err = s.writeAtomic(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		var instance, cur string
		var until int64
		err := tx.QueryRowContext(ctx, `SELECT instance, until, info FROM workers WHERE id = ?`, w.ID).Scan(&instance, &until, &cur)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return 0, mapErr(err)
		case instance != w.Instance && instance != p.Replace && until > p.Now.UnixNano():
			var holder task.WorkerInfo
			if err := json.Unmarshal([]byte(cur), &holder); err != nil {
				return 0, fmt.Errorf("decode worker %s: %w", w.ID, err)
			}
			return 0, &task.WorkerIDTakenError{Holder: holder}
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO workers (id, instance, until, info) VALUES (?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, until = excluded.until, info = excluded.info`,
			w.ID, w.Instance, nanos(w.Until), string(info))
		return 0, mapErr(err)
	})
	if err != nil {
		return fmt.Errorf("register worker %s: %w", w.ID, err)
	}
	return nil
}

// UnregisterWorker implements task.Registry.
func (s *Store) UnregisterWorker(ctx context.Context, id, instance string) error {
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		_, err := tx.ExecContext(ctx, `DELETE FROM workers WHERE id = ? AND instance = ?`, id, instance)
		return 0, mapErr(err)
	})
	if err != nil {
		return fmt.Errorf("unregister worker %s: %w", id, err)
	}
	return nil
}

// Workers implements task.Registry.
func (s *Store) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT info FROM workers ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", mapErr(err))
	}
	defer rows.Close()
	var out []task.WorkerInfo
	for rows.Next() {
		var info string
		if err := rows.Scan(&info); err != nil {
			return nil, fmt.Errorf("workers: %w", mapErr(err))
		}
		var w task.WorkerInfo
		if err := json.Unmarshal([]byte(info), &w); err != nil {
			return nil, fmt.Errorf("workers: decode: %w", err)
		}
		out = append(out, w)
	}
	return out, mapErr(rows.Err())
}
