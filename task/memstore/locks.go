// locks.go: lock keys and their waiting lines.

package memstore

import (
	"context"
	"fmt"

	"github.com/leasepool/leasepool/task"
)

// lockName is a lock key in its namespace: the key itself in LockTask,
// and otherwise the namespace, a NUL byte and the key (names hold no
// NUL), so two namespaces never share a name.
func lockName(ns task.LockNamespace, key string) string {
	if ns == task.LockTask {
		return key
	}
	return string(ns) + "\x00" + key
}

// AcquireLocks takes every key for p.Holder or none; see task.Store.
func (s *Store) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	if len(p.Keys) == 0 {
		return nil
	}
	f, err := s.enter(ctx, OpAcquire, p.Keys[0])
	if err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	s.n.lockCalls.Add(1)
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if stopped := db.checkLocks(p); stopped != nil {
		db.enterLines(p)
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, stopped)
	}
	for _, k := range p.Keys {
		n := lockName(p.Namespace, k)
		db.locks[n] = lockRow{holder: p.Holder, until: p.Until}
		if p.Line != nil {
			delete(db.lines[n], p.Holder.TaskKey)
		}
	}
	if f.Err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, f.Err)
	}
	return nil
}

// checkLocks returns what stops p: a key held by another live holder, or
// (with p.Line) a live place of an unfinished task ahead in a key's line.
// db.mu held.
func (db *DB) checkLocks(p task.LockParams) *task.LockedError {
	for _, k := range p.Keys {
		n := lockName(p.Namespace, k)
		if l, ok := db.locks[n]; ok {
			if l.holder == p.Holder {
				continue // a renewal: the holder is past the line
			}
			if l.until.After(p.Now) {
				return &task.LockedError{Namespace: p.Namespace, Key: k, Holder: l.holder, Until: l.until}
			}
		}
		if p.Line == nil {
			continue
		}
		var best *task.LockedError
		var bestPlace task.LockLine
		for tk, place := range db.lines[n] {
			t, ok := db.tasks[tk]
			if tk == p.Holder.TaskKey || !place.Until.After(p.Now) || !ok || t.State.Finished() ||
				!p.Line.Ahead(place.Priority, place.Seq) {
				continue
			}
			if best == nil || bestPlace.Ahead(place.Priority, place.Seq) {
				best = &task.LockedError{Namespace: p.Namespace, Key: k, Holder: task.Holder{TaskKey: tk}, Until: place.Until, Ahead: true}
				bestPlace = place
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

// enterLines enters or renews p's place in the line of each of its keys,
// dropping places that have lapsed. db.mu held.
func (db *DB) enterLines(p task.LockParams) {
	if p.Line == nil {
		return
	}
	for _, k := range p.Keys {
		n := lockName(p.Namespace, k)
		line := db.lines[n]
		if line == nil {
			line = map[string]task.LockLine{}
			db.lines[n] = line
		}
		for tk, place := range line {
			if !place.Until.After(p.Now) {
				delete(line, tk)
			}
		}
		line[p.Holder.TaskKey] = *p.Line
	}
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
	f, err := s.enter(ctx, OpRelease, p.Keys[0])
	if err != nil {
		return fmt.Errorf("release locks for %s: %w", p.Holder.TaskKey, err)
	}
	s.n.lockCalls.Add(1)
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	for _, h := range p.Heirs {
		db.enterLines(task.LockParams{Namespace: p.Namespace, Keys: []string{h.LockKey}, Holder: task.Holder{TaskKey: h.TaskKey}, Now: p.Now, Line: &h.LockLine})
	}
	for _, k := range p.Keys {
		n := lockName(p.Namespace, k)
		if l, ok := db.locks[n]; ok && l.holder == p.Holder {
			delete(db.locks, n)
		}
	}
	if f.Err != nil {
		return fmt.Errorf("release locks for %s: %w", p.Holder.TaskKey, f.Err)
	}
	return nil
}
