// tabletriggers.go is the embedded store's side of package trigger:
// SQL triggers on the user's own table record each matching change in
// leasepool_outbox, inside the user's transaction (a rolled-back write
// records nothing), and DrainOutbox publishes each recorded change and
// deletes it in one transaction (task.TableTriggerStore).

package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// outboxTable holds the changes the table triggers recorded until they
// are published. Its id is AUTOINCREMENT: never reused, even once the
// newest rows were deleted, so a change's id (and its task's key) is
// never another's.
const outboxTable = "leasepool_outbox"

// tableTriggerPrefix starts the names of the SQL triggers of table
// triggers: leasepool_trg_NAME_OP.
const tableTriggerPrefix = ReservedPrefix + "trg_"

func isTableTrigger(name string) bool {
	return strings.HasPrefix(strings.ToLower(name), tableTriggerPrefix)
}

func sqlTriggerName(name, op string) string { return tableTriggerPrefix + name + "_" + op }

// quoteIdent quotes an identifier for SQL.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// quoteText is s as an SQL string literal.
func quoteText(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

func invalidField(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, fmt.Sprintf(format, args...))
}

// filterColumns is a filter's columns, each with its value as an SQL
// literal.
func filterColumns(f json.RawMessage) (map[string]string, error) {
	m, err := task.TableFilter(f)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for col, v := range m {
		switch v := v.(type) {
		case nil:
			out[col] = "NULL"
		case bool:
			out[col] = map[bool]string{true: "1", false: "0"}[v]
		case json.Number:
			out[col] = v.String()
		case string:
			out[col] = quoteText(v)
		}
	}
	return out, nil
}

// columnsOf returns the table's name and columns as the schema spells
// them; ErrInvalid naming table when there is no such table, or it is
// one that takes no trigger (a virtual table).
func columnsOf(ctx context.Context, tx *sql.Tx, table string) (string, []string, error) {
	var name, def string
	err := tx.QueryRowContext(ctx, `SELECT name, coalesce(sql, '') FROM sqlite_schema WHERE type = 'table' AND name = ? COLLATE NOCASE`, table).Scan(&name, &def)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, invalidField("table", "no table %s in the store's file", table)
	}
	if err != nil {
		return "", nil, mapErr(err)
	}
	if strings.HasPrefix(strings.ToUpper(strings.Join(strings.Fields(def), " ")), "CREATE VIRTUAL TABLE") {
		return "", nil, invalidField("table", "%s is a virtual table, which SQLite gives no triggers", name)
	}
	rows, err := tx.QueryContext(ctx, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, name)
	if err != nil {
		return "", nil, mapErr(err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return "", nil, mapErr(err)
		}
		cols = append(cols, c)
	}
	return name, cols, mapErr(rows.Err())
}

// createOutbox makes the outbox table, once.
func createOutbox(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+outboxTable+` (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		name TEXT NOT NULL,
		op TEXT NOT NULL,
		row TEXT NOT NULL
	)`)
	if err == nil {
		_, err = tx.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS `+outboxTable+`_name ON `+outboxTable+` (name, id)`)
	}
	return mapErr(err)
}

func outboxExists(ctx context.Context, tx *sql.Tx) (bool, error) {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, outboxTable).Scan(&n)
	return n > 0, mapErr(err)
}

// dropSQLTriggers drops every SQL trigger of the table trigger name.
func dropSQLTriggers(ctx context.Context, tx *sql.Tx, name string) error {
	for _, op := range task.TableOperations {
		if _, err := tx.ExecContext(ctx, `DROP TRIGGER IF EXISTS `+quoteIdent(sqlTriggerName(name, op))); err != nil {
			return mapErr(err)
		}
	}
	return nil
}

// SetTableTrigger checks t against the file's schema, creates its SQL
// triggers (dropping those of a trigger of that name first) and stores
// doc, in one transaction; see task.TableTriggerStore.
func (s *Store) SetTableTrigger(ctx context.Context, t task.TableTrigger, doc task.Document) (task.Document, error) {
	if err := t.Validate(); err != nil {
		return task.Document{}, err
	}
	if Reserved(t.Table) || strings.HasPrefix(strings.ToLower(t.Table), "sqlite_") {
		return task.Document{}, invalidField("table", "%s is leasepool's or SQLite's own", t.Table)
	}
	value, err := task.CheckDocument(ctx, doc)
	if err != nil {
		return task.Document{}, err
	}
	filter, err := filterColumns(t.Filter)
	if err != nil {
		return task.Document{}, err
	}
	out := task.Document{Namespace: doc.Namespace, ID: doc.ID, Version: doc.Version + 1,
		Value: append(json.RawMessage(nil), value...), UpdatedAt: s.Now().UTC()}
	change, err := json.Marshal(out)
	if err != nil {
		return task.Document{}, err
	}
	changeDoc := string(change)
	err = s.writeAtomic(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		// SQLite's names ignore case: a trigger named like another but
		// for case would drop and take over the other's SQL triggers.
		var other string
		err := tx.QueryRowContext(ctx, `SELECT id FROM documents WHERE namespace = ? AND id = ? COLLATE NOCASE AND id != ?`,
			doc.Namespace, doc.ID, doc.ID).Scan(&other)
		switch {
		case err == nil:
			return 0, invalidField("name", "%s differs from the trigger %s only in case", t.Name, other)
		case !errors.Is(err, sql.ErrNoRows):
			return 0, mapErr(err)
		}
		table, cols, err := columnsOf(ctx, tx, t.Table)
		if err != nil {
			return 0, err
		}
		canon := func(field, c string) (string, error) {
			for _, have := range cols {
				if strings.EqualFold(have, c) {
					return have, nil
				}
			}
			return "", invalidField(field, "table %s has no column %s", table, c)
		}
		payload := cols
		if len(t.Columns) > 0 {
			payload = nil
			for _, c := range t.Columns {
				have, err := canon("fields", c)
				if err != nil {
					return 0, err
				}
				payload = append(payload, have)
			}
		}
		if len(payload) > 63 {
			return 0, invalidField("fields", "table %s has %d columns; name at most %d of them", table, len(payload), 63)
		}
		var conds []string // each "."+column+" IS "+literal, the row's name before it
		for c, lit := range filter {
			have, err := canon("filter", c)
			if err != nil {
				return 0, err
			}
			conds = append(conds, "."+quoteIdent(have)+" IS "+lit)
		}
		slices.Sort(conds) // the same trigger for the same filter
		if err := createOutbox(ctx, tx); err != nil {
			return 0, err
		}
		if err := dropSQLTriggers(ctx, tx, t.Name); err != nil {
			return 0, err
		}
		for _, op := range t.Operations {
			row := "NEW"
			if op == task.OpDelete {
				row = "OLD"
			}
			args := make([]string, 0, 2*len(payload))
			for _, c := range payload {
				v := row + "." + quoteIdent(c)
				// json_object refuses BLOBs: hex text, so that a user's
				// write never fails for the trigger's sake.
				args = append(args, quoteText(c), "CASE WHEN typeof("+v+") = 'blob' THEN hex("+v+") ELSE "+v+" END")
			}
			when := ""
			for i, c := range conds {
				when += map[bool]string{true: " WHEN ", false: " AND "}[i == 0] + row + c
			}
			q := fmt.Sprintf(`CREATE TRIGGER %s AFTER %s ON %s%s BEGIN INSERT INTO %s (name, op, row) VALUES (%s, %s, json_object(%s)); END`,
				quoteIdent(sqlTriggerName(t.Name, op)), strings.ToUpper(op), quoteIdent(table), when, outboxTable,
				quoteText(t.Name), quoteText(op), strings.Join(args, ", "))
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return 0, fmt.Errorf("create trigger on %s: %w", table, mapErr(err))
			}
		}
		return s.putDocumentTx(ctx, tx, doc, value, out, &changeDoc)
	})
	if errors.Is(err, task.ErrInvalid) {
		return task.Document{}, err // names its field, as it is
	}
	if err != nil {
		return task.Document{}, fmt.Errorf("table trigger %s: %w", t.Name, err)
	}
	return out, nil
}

// DropTableTrigger drops name's SQL triggers, its recorded changes and
// its document, in one transaction; see task.TableTriggerStore.
func (s *Store) DropTableTrigger(ctx context.Context, name string, doc task.Document) error {
	if err := task.CheckDocumentName(doc.Namespace, doc.ID); err != nil {
		return err
	}
	err := s.writeAtomic(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		if task.IsIdentifier(name) {
			if err := dropSQLTriggers(ctx, tx, name); err != nil {
				return 0, err
			}
		}
		if ok, err := outboxExists(ctx, tx); err != nil {
			return 0, err
		} else if ok {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+outboxTable+` WHERE name = ?`, name); err != nil {
				return 0, mapErr(err)
			}
		}
		var terms sql.NullString
		err := tx.QueryRowContext(ctx, `DELETE FROM documents WHERE namespace = ? AND id = ? RETURNING terms`, doc.Namespace, doc.ID).Scan(&terms)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, task.ErrNotFound
		}
		if err != nil {
			return 0, mapErr(err)
		}
		if err := s.dropTermsTx(ctx, tx, doc.Namespace, doc.ID, terms); err != nil {
			return 0, mapErr(err)
		}
		return s.appendDocChange(ctx, tx, doc.Namespace, doc.ID, nil)
	})
	if err != nil {
		return fmt.Errorf("table trigger %s: %w", name, err)
	}
	return nil
}

// DrainOutbox publishes up to limit of name's recorded changes and
// deletes them, in one transaction; see task.TableTriggerStore.
func (s *Store) DrainOutbox(ctx context.Context, def task.Document, name string, limit int, build func(task.OutboxChange) task.PublishParams) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: limit: must be positive", task.ErrInvalid)
	}
	if s.closed.Load() {
		return 0, errClosed
	}
	// A read first, outside the writer: a trigger with nothing waiting
	// (most polls) costs no write transaction.
	var waiting int
	err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+outboxTable+` WHERE name = ? LIMIT 1)`, name).Scan(&waiting)
	switch {
	case err != nil && strings.Contains(err.Error(), "no such table"):
		return 0, nil
	case err != nil:
		return 0, mapErr(err)
	case waiting == 0:
		return 0, nil
	}
	published := 0
	err = s.InTx(ctx, func(tx *Tx) error {
		published = 0
		var version int64
		err := tx.tx.QueryRowContext(tx.ctx, `SELECT version FROM documents WHERE namespace = ? AND id = ?`, def.Namespace, def.ID).Scan(&version)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("document %s/%s: %w", def.Namespace, def.ID, task.ErrNotFound)
		case err != nil:
			return mapErr(err)
		case version != def.Version:
			return fmt.Errorf("document %s/%s at version %d, not %d: %w", def.Namespace, def.ID, version, def.Version, task.ErrConflict)
		}
		rows, err := tx.tx.QueryContext(tx.ctx, `SELECT id, op, row FROM `+outboxTable+` WHERE name = ? ORDER BY id LIMIT ?`, name, limit)
		if err != nil {
			return mapErr(err)
		}
		var changes []task.OutboxChange
		for rows.Next() {
			var c task.OutboxChange
			var row string
			if err := rows.Scan(&c.ID, &c.Operation, &row); err != nil {
				rows.Close()
				return mapErr(err)
			}
			c.Row = json.RawMessage(row)
			changes = append(changes, c)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return mapErr(err)
		}
		for _, c := range changes {
			if _, _, err := tx.Publish(build(c)); err != nil {
				return fmt.Errorf("change %d: %w", c.ID, err)
			}
		}
		if len(changes) > 0 {
			last := changes[len(changes)-1].ID
			if _, err := tx.tx.ExecContext(tx.ctx, `DELETE FROM `+outboxTable+` WHERE name = ? AND id <= ?`, name, last); err != nil {
				return mapErr(err)
			}
		}
		published = len(changes)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("table trigger %s: drain: %w", name, err)
	}
	return published, nil
}
