// locks.go holds the named locks of task.Store: taken all or none in one
// savepoint, freed only by their holder.

package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// AcquireLocks takes every key for p.Holder or none; see task.Store.
func (s *Store) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if len(p.Keys) == 0 {
		return nil
	}
	now, until := p.Now.UnixNano(), p.Until.UnixNano()
	err := s.writeAtomic(ctx, func(tx *sql.Tx) (int64, error) {
		sel, up := tx.StmtContext(ctx, s.selLock), tx.StmtContext(ctx, s.upsertLock)
		for _, k := range p.Keys {
			var h task.Holder
			var u int64
			err := sel.QueryRowContext(ctx, k).Scan(&h.TaskKey, &h.WorkerID, &h.Attempt, &h.Instance, &u)
			switch {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return 0, mapErr(err)
			case h != p.Holder && u > now:
				return 0, &task.LockedError{Key: k, Holder: h, Until: time.Unix(0, u).UTC()}
			}
			if _, err := up.ExecContext(ctx, k, p.Holder.TaskKey, p.Holder.WorkerID, p.Holder.Attempt, p.Holder.Instance, until); err != nil {
				return 0, mapErr(err)
			}
		}
		return 0, nil
	})
	if err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	return nil
}

// ReleaseLocks frees the keys still held by p.Holder.
func (s *Store) ReleaseLocks(ctx context.Context, p task.LockParams) error {
	if len(p.Keys) == 0 {
		return nil
	}
	err := s.writeAtomic(ctx, func(tx *sql.Tx) (int64, error) {
		del := tx.StmtContext(ctx, s.delLock)
		for _, k := range p.Keys {
			if _, err := del.ExecContext(ctx, k, p.Holder.TaskKey, p.Holder.WorkerID, p.Holder.Attempt, p.Holder.Instance); err != nil {
				return 0, mapErr(err)
			}
		}
		return 0, nil
	})
	if err != nil {
		return fmt.Errorf("release locks for %s: %w", p.Holder.TaskKey, err)
	}
	return nil
}
