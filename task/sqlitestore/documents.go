// documents.go keeps task.Documents: one row per document, written by
// compare-and-set on its version, each write a change on the stream.

package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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
	err := s.rdb.QueryRowContext(ctx, `SELECT version, value, updated_at FROM `+s.documentsTable()+` WHERE namespace = ? AND id = ?`,
		namespace, id).Scan(&d.Version, &value, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", namespace, id, task.ErrNotFound)
	}
	if err != nil {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", namespace, id, mapErr(err))
	}
	d.Value, d.UpdatedAt = json.RawMessage(value), time.Unix(0, at).UTC()
	return d, nil
}

// PutDocument writes d by compare-and-set; see task.DocumentStore.
func (s *Store) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	value, err := task.CheckDocument(ctx, d)
	if err != nil {
		return task.Document{}, err
	}
	out := task.Document{Namespace: d.Namespace, ID: d.ID, Version: d.Version + 1,
		Value: append(json.RawMessage(nil), value...), UpdatedAt: s.Now().UTC()}
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
// value value, out (and its change doc) what it stores.
func (s *Store) putDocumentTx(ctx context.Context, tx *sql.Tx, d task.Document, value json.RawMessage, out task.Document, doc *string) (int64, error) {
	var res sql.Result
	var err error
	if d.Version == 0 {
		res, err = tx.ExecContext(ctx, `INSERT INTO documents (namespace, id, version, value, updated_at)
			VALUES (?, ?, 1, ?, ?) ON CONFLICT (namespace, id) DO NOTHING`, d.Namespace, d.ID, string(value), nanos(out.UpdatedAt))
	} else {
		res, err = tx.ExecContext(ctx, `UPDATE documents SET version = version + 1, value = ?, updated_at = ?
			WHERE namespace = ? AND id = ? AND version = ?`, string(value), nanos(out.UpdatedAt), d.Namespace, d.ID, d.Version)
	}
	if err != nil {
		return 0, mapErr(err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err != nil {
			return 0, mapErr(err)
		}
		err := s.missedDocument(ctx, tx, d.Namespace, d.ID, d.Version)
		if errors.Is(err, task.ErrNotFound) {
			err = fmt.Errorf("no document stored, not version %d: %w", d.Version, task.ErrConflict)
		}
		return 0, err
	}
	return s.appendDocChange(ctx, tx, d.Namespace, d.ID, doc)
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
		res, err := tx.ExecContext(ctx, `DELETE FROM documents WHERE namespace = ? AND id = ? AND (? = 0 OR version = ?)`,
			namespace, id, version, version)
		if err != nil {
			return 0, mapErr(err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err != nil {
				return 0, mapErr(err)
			}
			return 0, s.missedDocument(ctx, tx, namespace, id, max(version, 1))
		}
		return s.appendDocChange(ctx, tx, namespace, id, nil)
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
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, version, value, updated_at FROM `+s.documentsTable()+` WHERE namespace = ? ORDER BY id`, namespace)
	if err != nil {
		return nil, fmt.Errorf("documents %s: %w", namespace, mapErr(err))
	}
	defer rows.Close()
	var out []task.Document
	for rows.Next() {
		d := task.Document{Namespace: namespace}
		var value string
		var at int64
		if err := rows.Scan(&d.ID, &d.Version, &value, &at); err != nil {
			return nil, fmt.Errorf("documents %s: %w", namespace, mapErr(err))
		}
		d.Value, d.UpdatedAt = json.RawMessage(value), time.Unix(0, at).UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("documents %s: %w", namespace, mapErr(err))
	}
	return out, nil
}

// documentsTable is what readers read documents from: the documents
// table, and on a file a writer has not upgraded yet (read-only opens)
// the shared records that version 11 moves into it, each read as the
// document the upgrade will make of it.
func (s *Store) documentsTable() string {
	const records = `SELECT ` + recordNamespace + ` AS namespace, id, 1 AS version, value, at AS updated_at FROM records`
	switch {
	case s.readVersion >= 11:
		return "documents"
	case s.readVersion >= 10:
		return `(SELECT namespace, id, version, value, updated_at FROM documents UNION ALL ` + records +
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
