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
	d.Value, d.Terms = slices.Clone(d.Value), slices.Clone(d.Terms)
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
	terms, _ := task.CheckTerms("document terms", d.Terms) // checked by CheckDocument
	stored := task.Document{Namespace: d.Namespace, ID: d.ID, Version: d.Version + 1, Value: slices.Clone(v), UpdatedAt: s.Now(), Terms: terms}
	db.unindex(old)
	ns[d.ID] = stored
	db.index(stored)
	kept := stored
	db.record(change{document: &kept})
	if f.Err != nil {
		return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, f.Err)
	}
	stored.Value, stored.Terms = slices.Clone(stored.Value), slices.Clone(stored.Terms)
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
	db.unindex(old)
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
		d.Value, d.Terms = slices.Clone(d.Value), slices.Clone(d.Terms)
		out = append(out, d)
	}
	s.db.mu.Unlock()
	slices.SortFunc(out, func(a, b task.Document) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// DocumentsByTerms returns the documents of namespace carrying every one
// of terms, by id; see task.DocumentStore. It walks the ids of the term
// with the fewest.
func (s *Store) DocumentsByTerms(ctx context.Context, namespace string, terms []string) ([]task.Document, error) {
	terms, err := task.CheckTermsQuery(namespace, terms)
	if err != nil {
		return nil, err
	}
	if _, err := s.enter(ctx, OpDocument, ""); err != nil {
		return nil, fmt.Errorf("documents %s by terms: %w", namespace, err)
	}
	s.db.mu.Lock()
	index := s.db.terms[namespace]
	fewest := index[terms[0]]
	for _, t := range terms[1:] {
		if len(index[t]) < len(fewest) {
			fewest = index[t]
		}
	}
	out := make([]task.Document, 0, len(fewest))
	for id := range fewest {
		d := s.db.docs[namespace][id]
		if task.HasTerms(d.Terms, terms) {
			d.Value, d.Terms = slices.Clone(d.Value), slices.Clone(d.Terms)
			out = append(out, d)
		}
	}
	s.db.mu.Unlock()
	slices.SortFunc(out, func(a, b task.Document) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// index adds d's terms to the index; db.mu is held.
func (db *DB) index(d task.Document) {
	if len(d.Terms) == 0 {
		return
	}
	ns := db.terms[d.Namespace]
	if ns == nil {
		ns = map[string]map[string]struct{}{}
		db.terms[d.Namespace] = ns
	}
	for _, t := range d.Terms {
		ids := ns[t]
		if ids == nil {
			ids = map[string]struct{}{}
			ns[t] = ids
		}
		ids[d.ID] = struct{}{}
	}
}

// unindex removes d's terms from the index; db.mu is held.
func (db *DB) unindex(d task.Document) {
	ns := db.terms[d.Namespace]
	for _, t := range d.Terms {
		delete(ns[t], d.ID)
		if len(ns[t]) == 0 {
			delete(ns, t)
		}
	}
}
