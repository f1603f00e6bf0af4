package task

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// TableTriggerStore is what a Store offers when the user's own tables
// live in its file (the embedded store): package trigger type-asserts a
// Store on it, as on CollectionWatcher. A table trigger is SQL triggers
// on the user's table that record each matching change in an outbox of
// the store's own, inside the user's transaction; DrainOutbox turns the
// recorded changes into tasks.
type TableTriggerStore interface {
	// SetTableTrigger checks t against the file's schema, (re)creates its
	// SQL triggers and stores doc (compare-and-set on doc.Version, 0 for
	// a new one), all in one transaction: nothing is written when a check
	// or the document's write fails. Its check errors wrap ErrInvalid and
	// name the field (table, filter, fields, operations, name).
	SetTableTrigger(ctx context.Context, t TableTrigger, doc Document) (Document, error)
	// DropTableTrigger drops the SQL triggers of name, the changes its
	// outbox still holds and the document doc names (any version), in
	// one transaction.
	DropTableTrigger(ctx context.Context, name string, doc Document) error
	// DrainOutbox publishes up to limit of the changes trigger name
	// recorded, oldest first, each as build makes it, and deletes each
	// change in the transaction that publishes its task: a change is
	// published once, or, until that commits, not at all. The same
	// transaction checks that the trigger's document def is still at
	// def.Version (ErrConflict, or ErrNotFound, and nothing published,
	// otherwise), so that nothing publishes once a pause, a replace or
	// a remove committed. It returns how many it published; zero when
	// none wait.
	DrainOutbox(ctx context.Context, def Document, name string, limit int, build func(OutboxChange) PublishParams) (int, error)
}

// TableTrigger is the SQL side of a trigger on a table of the store's
// file.
type TableTrigger struct {
	// Name is the trigger's: an identifier (letters, digits, _).
	Name string
	// Table is the user's table: an identifier, an existing table, not
	// one of leasepool's.
	Table string
	// Filter is a JSON object of column values: a change publishes when
	// every named column equals its value (SQL IS: null matches NULL) in
	// the new row (the old row, for a delete). Empty: every change.
	Filter json.RawMessage
	// Operations are of TableOperations.
	Operations []string
	// Columns make the payload; empty: every column of the table as it
	// is when the trigger is set.
	Columns []string
}

// TableOperations are the kinds of change a table trigger may name.
var TableOperations = []string{OpInsert, OpUpdate, OpDelete}

// OutboxChange is one change a table trigger recorded.
type OutboxChange struct {
	// ID is the change's number: it grows with every change recorded in
	// the file and is never reused.
	ID        int64
	Operation string
	// Row is the changed row (the old one for a delete) as a JSON object
	// of its columns (BLOBs as hex text).
	Row json.RawMessage
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// IsIdentifier reports whether s is an SQL identifier that needs no
// quoting: letters, digits and _, not starting with a digit, at most 64.
func IsIdentifier(s string) bool { return identifier.MatchString(s) }

// maxPayloadColumns bounds a table trigger's payload columns: SQLite's
// functions take at most 127 arguments, two per column in json_object.
const maxPayloadColumns = 63

// Validate checks what of t needs no schema: the names are identifiers,
// the operations known, the filter an object of column values. The
// store checks the rest (the table exists and is not its own, the
// columns are the table's). Its errors wrap ErrInvalid and name the
// field.
func (t TableTrigger) Validate() error {
	const ident = "is not an identifier (letters, digits and _, not starting with a digit, at most 64)"
	if !IsIdentifier(t.Name) {
		return invalid("name", fmt.Sprintf("%q %s", t.Name, ident))
	}
	if !IsIdentifier(t.Table) {
		return invalid("table", fmt.Sprintf("%q %s", t.Table, ident))
	}
	if len(t.Operations) == 0 {
		return invalid("operations", "name at least one of "+strings.Join(TableOperations, ", "))
	}
	for i, op := range t.Operations {
		if !slices.Contains(TableOperations, op) {
			return invalid("operations", fmt.Sprintf("%q is not one of %s (a table trigger)", op, strings.Join(TableOperations, ", ")))
		}
		if slices.Contains(t.Operations[:i], op) {
			return invalid("operations", fmt.Sprintf("%q is named twice", op))
		}
	}
	for _, c := range t.Columns {
		if !IsIdentifier(c) {
			return invalid("fields", fmt.Sprintf("%q is not a column name (an identifier)", c))
		}
	}
	if len(t.Columns) > maxPayloadColumns {
		return invalid("fields", fmt.Sprintf("%d columns; at most %d", len(t.Columns), maxPayloadColumns))
	}
	_, err := TableFilter(t.Filter)
	return err
}

// TableFilter reads a table trigger's filter: each column and its value,
// a string, a json.Number, a bool or nil. Its errors wrap ErrInvalid and
// name the filter.
func TableFilter(f json.RawMessage) (map[string]any, error) {
	if len(f) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(f)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, invalid("filter", `want a JSON object of column values, such as {"status": "new"}`)
	}
	if dec.More() {
		return nil, invalid("filter", "want one JSON object")
	}
	if len(m) > 64 {
		return nil, invalid("filter", fmt.Sprintf("%d columns; at most 64", len(m)))
	}
	for col, v := range m {
		if !IsIdentifier(col) {
			return nil, invalid("filter", fmt.Sprintf("%q is not a column name (an identifier)", col))
		}
		switch v := v.(type) {
		case nil, bool:
		case json.Number:
			if _, err := strconv.ParseFloat(v.String(), 64); err != nil {
				return nil, invalid("filter", fmt.Sprintf("%s: %s is not a number SQLite reads", col, v))
			}
		case string:
			if strings.IndexByte(v, 0) >= 0 {
				return nil, invalid("filter", col+": a NUL byte")
			}
		default:
			return nil, invalid("filter", fmt.Sprintf("%s: want a string, number, boolean or null (equality), not an object or array", col))
		}
	}
	return m, nil
}
