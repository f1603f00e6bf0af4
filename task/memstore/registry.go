// registry.go: the worker registry.

package memstore

import (
	"context"
	"fmt"
	"slices"

	"github.com/leasepool/leasepool/task"
)

// RegisterWorker registers or renews a worker; see task.Registry.
func (s *Store) RegisterWorker(ctx context.Context, p task.RegisterParams) error {
	if err := task.ValidateWorkerInfo(p.Worker); err != nil {
		return fmt.Errorf("register worker: %w", err)
	}
	f, err := s.enter(ctx, OpRegister, p.Worker.ID)
	if err != nil {
		return fmt.Errorf("register worker %s: %w", p.Worker.ID, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if old, ok := db.workers[p.Worker.ID]; ok && old.Live(p.Now) && old.Instance != p.Worker.Instance &&
		(p.Replace == "" || old.Instance != p.Replace) {
		return &task.WorkerIDTakenError{Holder: old}
	}
	w := p.Worker
	w.Kinds = slices.Clone(w.Kinds)
	if _, ok := db.workers[w.ID]; !ok {
		i, _ := slices.BinarySearch(db.workerIDs, w.ID)
		db.workerIDs = slices.Insert(db.workerIDs, i, w.ID)
	}
	db.workers[w.ID] = w
	if f.Err != nil {
		return fmt.Errorf("register worker %s: %w", p.Worker.ID, f.Err)
	}
	return nil
}

// UnregisterWorker deletes id's record if instance still holds it.
func (s *Store) UnregisterWorker(ctx context.Context, id, instance string) error {
	if _, err := s.enter(ctx, OpRegister, id); err != nil {
		return fmt.Errorf("unregister worker %s: %w", id, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if w, ok := db.workers[id]; ok && w.Instance == instance {
		delete(db.workers, id)
		if i, ok := slices.BinarySearch(db.workerIDs, id); ok {
			db.workerIDs = slices.Delete(db.workerIDs, i, i+1)
		}
	}
	return nil
}

// Workers lists every record by id.
func (s *Store) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	if _, err := s.enter(ctx, OpWorkers, ""); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	db := s.db
	db.mu.Lock()
	out := make([]task.WorkerInfo, 0, len(db.workers))
	for _, id := range db.workerIDs {
		w := db.workers[id]
		w.Kinds = slices.Clone(w.Kinds)
		out = append(out, w)
	}
	db.mu.Unlock()
	return out, nil
}
