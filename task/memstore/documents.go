package memstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// GetDocument returns the document, or task.ErrNotFound.
func (s *Store) GetDocument(ctx context.Context, namespace, id string) (task.Document, error) {
	if err := task.CheckDocumentName(namespace, id); err != nil {
		return task.Document{}, err
	}
	if _, err := s.enter(ctx, OpDocument, id); err != nil {
		return task.Document{}, fmt.Errorf("get document %s/%s: %w", namespace, id, err)
	}
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	d, ok := s.db.docs[namespace][id]
	if !ok {
		return task.Document{}, fmt.Errorf("get document %s/%s: %w", namespace, id, task.ErrNotFound)
	}
	d.Value = slices.Clone(d.Value)
	return d, nil
}

// PutDocument writes d by compare-and-set on its version; see
// task.DocumentStore.
func (s *Store) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	v, err := task.CheckDocument(ctx, d)
	if err != nil {
		return task.Document{}, err
	}
	f, err := s.enter(ctx, OpDocument, d.ID)
	if err != nil {
		return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	ns := db.docs[d.Namespace]
	if ns == nil {
		ns = map[string]task.Document{}
		db.docs[d.Namespace] = ns
	}
	old, ok := ns[d.ID]
	if (ok && old.Version != d.Version) || (!ok && d.Version != 0) {
		return task.Document{}, fmt.Errorf("put document %s/%s version %d: %w", d.Namespace, d.ID, d.Version, task.ErrConflict)
	}
	stored := task.Document{Namespace: d.Namespace, ID: d.ID, Version: d.Version + 1, Value: slices.Clone(v), UpdatedAt: s.Now()}
	ns[d.ID] = stored
	kept := stored
	db.record(change{document: &kept})
	if f.Err != nil {
		return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, f.Err)
	}
	stored.Value = slices.Clone(stored.Value)
	return stored, nil
}

// DeleteDocument deletes the document at version (any, for 0); see
// task.DocumentStore.
func (s *Store) DeleteDocument(ctx context.Context, namespace, id string, version int64) error {
	if err := task.CheckDocumentName(namespace, id); err != nil {
		return err
	}
	f, err := s.enter(ctx, OpDocument, id)
	if err != nil {
		return fmt.Errorf("delete document %s/%s: %w", namespace, id, err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	old, ok := db.docs[namespace][id]
	switch {
	case !ok:
		return fmt.Errorf("delete document %s/%s: %w", namespace, id, task.ErrNotFound)
	case version != 0 && old.Version != version:
		return fmt.Errorf("delete document %s/%s version %d: %w", namespace, id, version, task.ErrConflict)
	}
	delete(db.docs[namespace], id)
	db.record(change{document: &task.Document{Namespace: namespace, ID: id}, deleted: true})
	if f.Err != nil {
		return fmt.Errorf("delete document %s/%s: %w", namespace, id, f.Err)
	}
	return nil
}

// Documents returns every document of namespace, by id.
func (s *Store) Documents(ctx context.Context, namespace string) ([]task.Document, error) {
	if err := task.ValidateName("document namespace", namespace); err != nil {
		return nil, err
	}
	if _, err := s.enter(ctx, OpDocument, ""); err != nil {
		return nil, fmt.Errorf("documents %s: %w", namespace, err)
	}
	s.db.mu.Lock()
	out := make([]task.Document, 0, len(s.db.docs[namespace]))
	for _, d := range s.db.docs[namespace] {
		d.Value = slices.Clone(d.Value)
		out = append(out, d)
	}
	s.db.mu.Unlock()
	slices.SortFunc(out, func(a, b task.Document) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
