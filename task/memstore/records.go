// records.go: shared records.

package memstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// PutRecord stores r unless a later one of its kind and id is stored.
func (s *Store) PutRecord(ctx context.Context, r task.Record) error {
	if err := task.ValidateName("record kind", r.Kind); err != nil {
		return err
	}
	if err := task.ValidateName("record id", r.ID); err != nil {
		return err
	}
	if _, err := s.enter(ctx, OpRecords, r.Kind); err != nil {
		return fmt.Errorf("put record %s/%s: %w", r.Kind, r.ID, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	m := db.records[r.Kind]
	if m == nil {
		m = map[string]task.Record{}
		db.records[r.Kind] = m
	}
	if old, ok := m[r.ID]; ok && old.At.After(r.At) {
		return nil
	}
	r.Value = slices.Clone(r.Value)
	m[r.ID] = r
	return nil
}

// Records returns every record of kind, by id.
func (s *Store) Records(ctx context.Context, kind string) ([]task.Record, error) {
	if _, err := s.enter(ctx, OpRecords, kind); err != nil {
		return nil, fmt.Errorf("records %s: %w", kind, err)
	}
	db := s.db
	db.mu.Lock()
	out := make([]task.Record, 0, len(db.records[kind]))
	for _, r := range db.records[kind] {
		r.Value = slices.Clone(r.Value)
		out = append(out, r)
	}
	db.mu.Unlock()
	slices.SortFunc(out, func(a, b task.Record) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// DeleteRecord deletes the record of kind and id, if any.
func (s *Store) DeleteRecord(ctx context.Context, kind, id string) error {
	if _, err := s.enter(ctx, OpRecords, kind); err != nil {
		return fmt.Errorf("delete record %s/%s: %w", kind, id, err)
	}
	s.db.mu.Lock()
	delete(s.db.records[kind], id)
	s.db.mu.Unlock()
	return nil
}
