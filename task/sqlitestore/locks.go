// locks.go holds the named locks of task.Store: taken all or none in one
// savepoint, freed only by their holder, and served in line order to
// callers that give a task.LockLine (table lock_lines). Every row is
// keyed by namespace and key.

package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// AcquireLocks takes every key for p.Holder or none; see task.Store. All
// keys are checked before any is written, so that a call stopped by a key
// can still commit its place in that key's line (p.Line).
func (s *Store) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	if len(p.Keys) == 0 {
		return nil
	}
	var stopped *task.LockedError
	err := s.writeAtomic(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		var err error
		if stopped, err = s.checkLocks(ctx, tx, p); err != nil {
			return 0, err
		}
		if stopped != nil {
			return 0, s.enterLines(ctx, tx, p)
		}
		return 0, s.takeLocks(ctx, tx, p)
	})
	if err == nil && stopped != nil {
		err = stopped
	}
	if err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	return nil
}

// checkLocks returns what stops p: a key held by another live holder, or
// (with p.Line) a live place of an unfinished task ahead in a key's line.
func (s *Store) checkLocks(ctx context.Context, tx *sql.Tx, p task.LockParams) (*task.LockedError, error) {
	now, ns := p.Now.UnixNano(), string(p.Namespace)
	sel, ahead := tx.StmtContext(ctx, s.selLock), tx.StmtContext(ctx, s.selAhead)
	for _, k := range p.Keys {
		var h task.Holder
		var u int64
		err := sel.QueryRowContext(ctx, ns, k).Scan(&h.TaskKey, &h.WorkerID, &h.Attempt, &h.Instance, &u)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, mapErr(err)
		case h == p.Holder:
			continue // a renewal: the holder is past the line
		case u > now:
			return &task.LockedError{Namespace: p.Namespace, Key: k, Holder: h, Until: time.Unix(0, u).UTC()}, nil
		}
		if p.Line == nil {
			continue
		}
		l := p.Line
		var w task.Holder
		err = ahead.QueryRowContext(ctx, ns, k, p.Holder.TaskKey, now, l.Priority, l.Priority, l.Seq).Scan(&w.TaskKey, &u)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, mapErr(err)
		default:
			return &task.LockedError{Namespace: p.Namespace, Key: k, Holder: w, Until: time.Unix(0, u).UTC(), Ahead: true}, nil
		}
	}
	return nil, nil
}

// enterLines enters or renews p's place in the line of each of its keys
// (not only the one that stopped it: a task waiting on one key keeps its
// rank on the others), dropping places that have lapsed.
func (s *Store) enterLines(ctx context.Context, tx *sql.Tx, p task.LockParams) error {
	if p.Line == nil {
		return nil
	}
	prune, upsert := tx.StmtContext(ctx, s.pruneLine), tx.StmtContext(ctx, s.upsertPlace)
	l, ns := p.Line, string(p.Namespace)
	for _, key := range p.Keys {
		if _, err := prune.ExecContext(ctx, ns, key, p.Now.UnixNano()); err != nil {
			return mapErr(err)
		}
		if _, err := upsert.ExecContext(ctx, ns, key, p.Holder.TaskKey, l.Priority, l.Seq, l.Until.UnixNano()); err != nil {
			return mapErr(err)
		}
	}
	return nil
}

// takeLocks writes p.Holder into every key and, with p.Line, leaves their
// lines.
func (s *Store) takeLocks(ctx context.Context, tx *sql.Tx, p task.LockParams) error {
	up, leave := tx.StmtContext(ctx, s.upsertLock), tx.StmtContext(ctx, s.delPlace)
	ns := string(p.Namespace)
	for _, k := range p.Keys {
		if _, err := up.ExecContext(ctx, ns, k, p.Holder.TaskKey, p.Holder.WorkerID, p.Holder.Attempt, p.Holder.Instance, p.Until.UnixNano()); err != nil {
			return mapErr(err)
		}
		if p.Line == nil {
			continue
		}
		if _, err := leave.ExecContext(ctx, ns, k, p.Holder.TaskKey); err != nil {
			return mapErr(err)
		}
	}
	return nil
}

// ReleaseLocks enters p.Heirs' places, then frees the keys still held by
// p.Holder.
func (s *Store) ReleaseLocks(ctx context.Context, p task.LockParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("release locks for %s: %w", p.Holder.TaskKey, err)
	}
	if len(p.Keys) == 0 {
		return nil
	}
	err := s.writeAtomic(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		for _, h := range p.Heirs {
			heir := task.LockParams{Namespace: p.Namespace, Keys: []string{h.LockKey}, Holder: task.Holder{TaskKey: h.TaskKey}, Now: p.Now, Line: &h.LockLine}
			if err := s.enterLines(ctx, tx, heir); err != nil {
				return 0, err
			}
		}
		del := tx.StmtContext(ctx, s.delLock)
		for _, k := range p.Keys {
			if _, err := del.ExecContext(ctx, string(p.Namespace), k, p.Holder.TaskKey, p.Holder.WorkerID, p.Holder.Attempt, p.Holder.Instance); err != nil {
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
