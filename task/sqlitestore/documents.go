// documents.go keeps task.Documents: one row per document, written by
// compare-and-set on its version, each write a change on the stream.

package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// GetDocument returns the document; see task.DocumentStore.
func (s *Store) GetDocument(ctx context.Context, namespace, id string) (task.Document, error) {
	if err := task.CheckDocumentName(namespace, id); err != nil {
		return task.Document{}, err
	}
	if s.closed.Load() {
		return task.Document{}, errClosed
	}
	d := task.Document{Namespace: namespace, ID: id}
	var value string
	var at int64
	var terms sql.NullString
	err := s.rdb.QueryRowContext(ctx, `SELECT version, value, updated_at, terms FROM `+s.documentsTable()+` WHERE namespace = ? AND id = ?`,
		namespace, id).Scan(&d.Version, &value, &at, &terms)
	if errors.Is(err, sql.ErrNoRows) {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", namespace, id, task.ErrNotFound)
	}
	if err != nil {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", namespace, id, mapErr(err))
	}
	d.Value, d.UpdatedAt = json.RawMessage(value), time.Unix(0, at).UTC()
	if d.Terms, err = decodeTerms(terms); err != nil {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", namespace, id, err)
	}
	return d, nil
}

// PutDocument writes d by compare-and-set; see task.DocumentStore.
func (s *Store) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	value, err := task.CheckDocument(ctx, d)
	if err != nil {
		return task.Document{}, err
	}
	terms, _ := task.CheckTerms("document terms", d.Terms) // checked by CheckDocument
	out := task.Document{Namespace: d.Namespace, ID: d.ID, Version: d.Version + 1,
		Value: append(json.RawMessage(nil), value...), UpdatedAt: s.Now().UTC(), Terms: terms}
	change, err := json.Marshal(out)
	if err != nil {
		return task.Document{}, err
	}
	doc := string(change)
	err = s.writeBulk(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		return s.putDocumentTx(ctx, tx, d, value, out, &doc)
	})
	if err != nil {
		return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, err)
	}
	return out, nil
}

// putDocumentTx is PutDocument's write in tx: d by compare-and-set, its
// value value, out (and its change doc) what it stores, out.Terms
// replacing the document's terms in the index. It runs in the bulk lane
// without a savepoint: it either writes nothing and returns a task
// sentinel (the compare-and-set is decided before any write), or fails
// the whole batch (termsErr) once the document row is written.
func (s *Store) putDocumentTx(ctx context.Context, tx *sql.Tx, d task.Document, value json.RawMessage, out task.Document, doc *string) (int64, error) {
	terms := encodeTerms(out.Terms)
	var old []string
	if d.Version == 0 {
		res, err := tx.ExecContext(ctx, `INSERT INTO documents (namespace, id, version, value, updated_at, terms)
			VALUES (?, ?, 1, ?, ?, ?) ON CONFLICT (namespace, id) DO NOTHING`, d.Namespace, d.ID, string(value), nanos(out.UpdatedAt), terms)
		if err != nil {
			return 0, mapErr(err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err != nil {
				return 0, mapErr(err)
			}
			return 0, task.ErrConflict
		}
	} else {
		// The stored version and terms first: one writer, so nothing
		// comes between this read and the update.
		var stored int64
		var was sql.NullString
		err := s.txStmt(tx, s.selDocTerms).QueryRowContext(ctx, d.Namespace, d.ID).Scan(&stored, &was)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return 0, fmt.Errorf("no document stored, not version %d: %w", d.Version, task.ErrConflict)
		case err != nil:
			return 0, mapErr(err)
		case stored != d.Version:
			return 0, fmt.Errorf("stored version %d, not %d: %w", stored, d.Version, task.ErrConflict)
		}
		if old, err = decodeTerms(was); err != nil {
			return 0, err
		}
		res, err := tx.ExecContext(ctx, `UPDATE documents SET version = version + 1, value = ?, updated_at = ?, terms = ?
			WHERE namespace = ? AND id = ? AND version = ?`, string(value), nanos(out.UpdatedAt), terms, d.Namespace, d.ID, d.Version)
		if err != nil {
			return 0, mapErr(err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return 0, termsErr(fmt.Errorf("updated %d rows (%v)", n, err))
		}
	}
	gone, added := diffTerms(old, out.Terms)
	if len(gone) > 0 {
		if _, err := s.txStmt(tx, s.delTerms).ExecContext(ctx, d.Namespace, d.ID, encodeTerms(gone)); err != nil {
			return 0, termsErr(err)
		}
	}
	if len(added) > 0 {
		if _, err := s.txStmt(tx, s.insTerms).ExecContext(ctx, d.Namespace, d.ID, encodeTerms(added)); err != nil {
			return 0, termsErr(err)
		}
	}
	seq, err := s.appendDocChange(ctx, tx, d.Namespace, d.ID, doc)
	if err != nil {
		return 0, termsErr(err)
	}
	return seq, nil
}

// dropTermsTx removes the terms of a document just deleted, which were
// terms (NULL: stored before terms, none in the index).
func (s *Store) dropTermsTx(ctx context.Context, tx *sql.Tx, namespace, id string, terms sql.NullString) error {
	old, err := decodeTerms(terms)
	if err != nil || len(old) == 0 {
		return err
	}
	_, err = s.txStmt(tx, s.delTerms).ExecContext(ctx, namespace, id, encodeTerms(old))
	return err
}

// termsErr is an error after a document's row was written: never a task
// sentinel, so that the writer rolls the batch back (a sentinel would
// let it commit the row without its terms).
func termsErr(err error) error {
	return fmt.Errorf("sqlitestore: document write: %s", mapErr(err))
}

// encodeTerms is terms as documents.terms and the term statements take
// them: a JSON array, "[]" for none.
func encodeTerms(terms []string) string {
	if len(terms) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(terms)
	return string(b)
}

// decodeTerms reads documents.terms: nil for NULL (stored before terms)
// and for none.
func decodeTerms(s sql.NullString) ([]string, error) {
	if !s.Valid || s.String == "[]" {
		return nil, nil
	}
	var terms []string
	if err := json.Unmarshal([]byte(s.String), &terms); err != nil {
		return nil, fmt.Errorf("document terms: %w", err)
	}
	return terms, nil
}

// diffTerms returns the terms of old not in next, and of next not in old;
// both are sorted.
func diffTerms(old, next []string) (gone, added []string) {
	i, j := 0, 0
	for i < len(old) || j < len(next) {
		switch {
		case j == len(next) || (i < len(old) && old[i] < next[j]):
			gone = append(gone, old[i])
			i++
		case i == len(old) || next[j] < old[i]:
			added = append(added, next[j])
			j++
		default:
			i++
			j++
		}
	}
	return gone, added
}

// missedDocument is the error of a compare-and-set on version that
// changed no row: ErrNotFound when no document is stored and one was
// expected, else ErrConflict.
func (s *Store) missedDocument(ctx context.Context, tx *sql.Tx, namespace, id string, version int64) error {
	if version == 0 {
		return task.ErrConflict
	}
	var stored int64
	err := tx.QueryRowContext(ctx, `SELECT version FROM documents WHERE namespace = ? AND id = ?`, namespace, id).Scan(&stored)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return task.ErrNotFound
	case err != nil:
		return mapErr(err)
	}
	return fmt.Errorf("stored version %d, not %d: %w", stored, version, task.ErrConflict)
}

// DeleteDocument deletes the document; see task.DocumentStore.
func (s *Store) DeleteDocument(ctx context.Context, namespace, id string, version int64) error {
	if err := task.CheckDocumentName(namespace, id); err != nil {
		return err
	}
	err := s.writeBulk(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		var terms sql.NullString
		err := tx.QueryRowContext(ctx, `DELETE FROM documents WHERE namespace = ? AND id = ? AND (? = 0 OR version = ?) RETURNING terms`,
			namespace, id, version, version).Scan(&terms)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, s.missedDocument(ctx, tx, namespace, id, max(version, 1))
		}
		if err != nil {
			return 0, mapErr(err)
		}
		if err := s.dropTermsTx(ctx, tx, namespace, id, terms); err != nil {
			return 0, termsErr(err)
		}
		seq, err := s.appendDocChange(ctx, tx, namespace, id, nil)
		if err != nil {
			return 0, termsErr(err)
		}
		return seq, nil
	})
	if err != nil {
		return fmt.Errorf("delete document %s/%s: %w", namespace, id, err)
	}
	return nil
}

// Documents returns every document of namespace; see task.DocumentStore.
func (s *Store) Documents(ctx context.Context, namespace string) ([]task.Document, error) {
	if err := task.ValidateName("document namespace", namespace); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, errClosed
	}
	out, err := s.queryDocuments(ctx, namespace, `SELECT id, version, value, updated_at, terms FROM `+s.documentsTable()+` WHERE namespace = ? ORDER BY id`, namespace)
	if err != nil {
		return nil, fmt.Errorf("documents %s: %w", namespace, err)
	}
	return out, nil
}

// DocumentsByTerms returns the documents of namespace carrying every one
// of terms; see task.DocumentStore. The ids come off the index's primary
// key, a range per term intersected, then each document by its own; the
// documents stored before terms (terms NULL) off their partial index.
func (s *Store) DocumentsByTerms(ctx context.Context, namespace string, terms []string) ([]task.Document, error) {
	terms, err := task.CheckTermsQuery(namespace, terms)
	if err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, errClosed
	}
	if s.readVersion < 13 {
		// A file not upgraded yet (a read-only open): no document has
		// terms, every one is returned, as stored before them.
		return s.Documents(ctx, namespace)
	}
	var args []any
	for _, t := range terms {
		args = append(args, namespace, t)
	}
	args = append(args, namespace, namespace)
	out, err := s.queryDocuments(ctx, namespace, documentsByTermsSQL(len(terms)), args...)
	if err != nil {
		return nil, fmt.Errorf("documents %s by terms: %w", namespace, err)
	}
	slices.SortFunc(out, func(a, b task.Document) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// documentsByTermsSQL is the query of DocumentsByTerms for n terms, whose
// arguments are each term with its namespace, then the namespace twice.
// The CROSS JOIN makes the index's ids the outer loop: without
// statistics the planner would rather walk the namespace's documents and
// look each one up in the index, the scan the index is there to avoid.
// Sorted by the caller (the ids come in order, the documents without
// terms after them).
func documentsByTermsSQL(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = `SELECT id FROM leasepool_document_terms WHERE namespace = ? AND term = ?`
	}
	return `SELECT d.id, d.version, d.value, d.updated_at, d.terms FROM (` + strings.Join(ids, ` INTERSECT `) + `) t
		CROSS JOIN documents d ON d.namespace = ? AND d.id = t.id
		UNION ALL SELECT id, version, value, updated_at, terms FROM documents INDEXED BY leasepool_documents_unindexed
		WHERE namespace = ? AND terms IS NULL`
}

// queryDocuments runs q, a query of (id, version, value, updated_at,
// terms) rows of namespace, on the read connections.
func (s *Store) queryDocuments(ctx context.Context, namespace, q string, args ...any) ([]task.Document, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, mapErr(err)
	}
	defer rows.Close()
	var out []task.Document
	for rows.Next() {
		d := task.Document{Namespace: namespace}
		var value string
		var at int64
		var terms sql.NullString
		if err := rows.Scan(&d.ID, &d.Version, &value, &at, &terms); err != nil {
			return nil, mapErr(err)
		}
		d.Value, d.UpdatedAt = json.RawMessage(value), time.Unix(0, at).UTC()
		if d.Terms, err = decodeTerms(terms); err != nil {
			return nil, fmt.Errorf("%s: %w", d.ID, err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr(err)
	}
	return out, nil
}

// documentsTable is what readers read documents from: the documents
// table, and on a file a writer has not upgraded yet (read-only opens)
// the shared records that version 11 moves into it, each read as the
// document the upgrade will make of it, and before version 13 every
// document without terms.
func (s *Store) documentsTable() string {
	const records = `SELECT ` + recordNamespace + ` AS namespace, id, 1 AS version, value, at AS updated_at, NULL AS terms FROM records`
	switch {
	case s.readVersion >= 13:
		return "documents"
	case s.readVersion >= 11:
		return "(SELECT namespace, id, version, value, updated_at, NULL AS terms FROM documents)"
	case s.readVersion >= 10:
		return `(SELECT namespace, id, version, value, updated_at, NULL AS terms FROM documents UNION ALL ` + records +
			` WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.namespace = ` + recordNamespace + ` AND d.id = records.id))`
	}
	return "(" + records + ")"
}

// decodeDocument reads a document change's JSON.
func decodeDocument(s string) (*task.Document, error) {
	var d task.Document
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		return nil, err
	}
	return &d, nil
}
