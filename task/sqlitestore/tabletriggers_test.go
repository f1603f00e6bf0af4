package sqlitestore_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// tableStore opens a new store with the user's table orders, and the
// user's own connection to its file, as another process would open it.
func tableStore(t *testing.T) (*sqlitestore.Store, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	s := open(t, path, nil)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	mustExec(t, db, `CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)`)
	return s, db
}

func mustExec(t *testing.T, db interface {
	Exec(string, ...any) (sql.Result, error)
}, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// drained publishes every recorded change of name as a task of kind k
// keyed by the change's id, and returns the payloads by key.
func drained(t *testing.T, s *sqlitestore.Store, def task.Document, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for {
		n, err := s.DrainOutbox(t.Context(), def, name, 3, func(c task.OutboxChange) task.PublishParams {
			return task.PublishParams{Key: fmt.Sprintf("%s-%d", name, c.ID), Kind: "k",
				Payload: json.RawMessage(fmt.Sprintf(`{"op":%q,"row":%s}`, c.Operation, c.Row))}
		})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	ts, err := s.List(t.Context(), task.ListQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range ts {
		if strings.HasPrefix(tk.Key, name+"-") {
			out[tk.Key] = string(tk.Payload)
		}
	}
	return out
}

func sqlTriggers(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type = 'trigger' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		out = append(out, n)
	}
	return out
}

// TestTableTrigger: the SQL triggers record each matching change of the
// user's table, written through the user's own connection, in the
// user's transaction (a rollback records nothing); a drain publishes each
// once; a drop takes the SQL triggers and the unpublished changes away.
func TestTableTrigger(t *testing.T) {
	t.Parallel()
	s, db := tableStore(t)
	mustExec(t, db, `CREATE TABLE readings (id INTEGER PRIMARY KEY, status TEXT, v REAL, raw BLOB, "odd col" TEXT)`)
	doc := task.Document{Namespace: "leasepool.trigger", ID: "hot", Value: json.RawMessage(`{"name":"hot"}`)}
	def, err := s.SetTableTrigger(task.WithInternalWrite(t.Context()), task.TableTrigger{Name: "hot", Table: "Readings", Filter: json.RawMessage(`{"status":"it's new"}`),
		Operations: []string{task.OpInsert, task.OpUpdate, task.OpDelete}}, doc)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO readings (id, status, v, raw, "odd col") VALUES (1, 'it''s new', 1.5, x'00ff', 'a'), (2, 'old', 2, NULL, 'b')`)
	mustExec(t, db, `UPDATE readings SET v = 3 WHERE id IN (1, 2)`)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, `INSERT INTO readings (id, status) VALUES (3, 'it''s new')`)
	tx.Rollback()
	mustExec(t, db, `DELETE FROM readings WHERE id = 1`)
	// The store's own transaction fires them too.
	if err := s.InTx(t.Context(), func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(`INSERT INTO readings (id, status) VALUES (4, 'it''s new')`)
		return err
	}); err != nil {
		t.Fatalf("InTx insert into a table with a trigger: %v", err)
	}
	if err := s.InTx(t.Context(), func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`INSERT INTO readings (id, status) VALUES (5, 'it''s new')`); err != nil {
			return err
		}
		return errors.New("changed my mind")
	}); err == nil {
		t.Fatal("InTx returned nil")
	}
	// Nor touch the outbox itself, nor drop the SQL triggers (directly or
	// with their table) behind the trigger's back.
	for _, q := range []string{`DELETE FROM leasepool_outbox`, `INSERT INTO leasepool_outbox (name, op, row) VALUES ('hot', 'insert', '{}')`,
		`DROP TRIGGER leasepool_trg_hot_insert`, `DROP TABLE readings`} {
		err := s.InTx(t.Context(), func(tx *sqlitestore.Tx) error { _, err := tx.Exec(q); return err })
		if !errors.Is(err, task.ErrInvalid) {
			t.Errorf("InTx %s: %v; want refused", q, err)
		}
	}
	got := drained(t, s, def, "hot")
	want := []string{
		`{"op":"insert","row":{"id":1,"status":"it's new","v":1.5,"raw":"00FF","odd col":"a"}}`,
		`{"op":"update","row":{"id":1,"status":"it's new","v":3.0,"raw":"00FF","odd col":"a"}}`,
		`{"op":"delete","row":{"id":1,"status":"it's new","v":3.0,"raw":"00FF","odd col":"a"}}`,
		`{"op":"insert","row":{"id":4,"status":"it's new","v":null,"raw":null,"odd col":null}}`,
	}
	var payloads []string
	for _, p := range got {
		var v any
		json.Unmarshal([]byte(p), &v)
		b, _ := json.Marshal(v)
		payloads = append(payloads, string(b))
	}
	for _, w := range want {
		var v any
		if err := json.Unmarshal([]byte(w), &v); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(v)
		found := false
		for _, p := range payloads {
			found = found || p == string(b)
		}
		if !found {
			t.Errorf("no task with payload %s; got %v", b, payloads)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d tasks, want %d: %v", len(got), len(want), payloads)
	}
	if again := drained(t, s, def, "hot"); len(again) != len(got) {
		t.Errorf("a second drain published more: %d tasks, then %d", len(got), len(again))
	}

	// Another trigger named alike but for case would take its SQL
	// triggers over: refused.
	if _, err := s.SetTableTrigger(task.WithInternalWrite(t.Context()), task.TableTrigger{Name: "HOT", Table: "readings",
		Operations: []string{task.OpInsert}}, task.Document{Namespace: doc.Namespace, ID: "HOT", Value: json.RawMessage(`{}`)}); !errors.Is(err, task.ErrInvalid) ||
		!strings.Contains(err.Error(), "name: ") {
		t.Errorf("a trigger named HOT beside hot: %v; want refused naming name", err)
	}

	// Dropped: its SQL triggers and the changes not yet published go.
	mustExec(t, db, `INSERT INTO readings (id, status) VALUES (6, 'it''s new')`)
	if err := s.DropTableTrigger(t.Context(), "hot", doc); err != nil {
		t.Fatal(err)
	}
	if trs := sqlTriggers(t, db); len(trs) != 0 {
		t.Errorf("SQL triggers left after the drop: %v", trs)
	}
	if n := drained(t, s, def, "hot"); len(n) != len(got) {
		t.Errorf("a dropped trigger's change published: %d tasks, was %d", len(n), len(got))
	}
	if _, err := s.GetDocument(t.Context(), doc.Namespace, doc.ID); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("document after the drop: %v", err)
	}
}

// TestTableTriggerRefused: a bad trigger is refused naming the field,
// with nothing written: no document, no SQL trigger, no outbox.
func TestTableTriggerRefused(t *testing.T) {
	t.Parallel()
	s, db := tableStore(t)
	ops := []string{task.OpInsert}
	for _, c := range []struct {
		name  string
		tr    task.TableTrigger
		field string
	}{
		{"unknown table", task.TableTrigger{Name: "a", Table: "nope", Operations: ops}, "table: "},
		{"leasepool's table", task.TableTrigger{Name: "a", Table: "tasks", Operations: ops}, "table: "},
		{"leasepool's outbox", task.TableTrigger{Name: "a", Table: "leasepool_outbox", Operations: ops}, "table: "},
		{"sqlite's table", task.TableTrigger{Name: "a", Table: "sqlite_schema", Operations: ops}, "table: "},
		{"table not an identifier", task.TableTrigger{Name: "a", Table: "orders; DROP TABLE x", Operations: ops}, "table: "},
		{"name not an identifier", task.TableTrigger{Name: "a-b", Table: "orders", Operations: ops}, "name: "},
		{"filter unknown column", task.TableTrigger{Name: "a", Table: "orders", Operations: ops, Filter: json.RawMessage(`{"nope":1}`)}, "filter: "},
		{"filter not an object", task.TableTrigger{Name: "a", Table: "orders", Operations: ops, Filter: json.RawMessage(`[1]`)}, "filter: "},
		{"filter nested", task.TableTrigger{Name: "a", Table: "orders", Operations: ops, Filter: json.RawMessage(`{"note":{"$gt":1}}`)}, "filter: "},
		{"filter column not an identifier", task.TableTrigger{Name: "a", Table: "orders", Operations: ops, Filter: json.RawMessage(`{"note = 1 OR 1":1}`)}, "filter: "},
		{"unknown payload column", task.TableTrigger{Name: "a", Table: "orders", Operations: ops, Columns: []string{"nope"}}, "fields: "},
		{"replace", task.TableTrigger{Name: "a", Table: "orders", Operations: []string{"replace"}}, "operations: "},
		{"no operations", task.TableTrigger{Name: "a", Table: "orders"}, "operations: "},
	} {
		doc := task.Document{Namespace: "leasepool.trigger", ID: "a", Value: json.RawMessage(`{}`)}
		_, err := s.SetTableTrigger(task.WithInternalWrite(t.Context()), c.tr, doc)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v; want invalid naming %q", c.name, err, c.field)
		}
		if strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%s: a refusal of more than one line: %q", c.name, err)
		}
	}
	if _, err := s.GetDocument(t.Context(), "leasepool.trigger", "a"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("a refused trigger's document: %v", err)
	}
	if trs := sqlTriggers(t, db); len(trs) != 0 {
		t.Errorf("a refused trigger left SQL triggers: %v", trs)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name LIKE 'leasepool_outbox%'`).Scan(&n)
	if n != 0 {
		t.Errorf("a refused trigger made the outbox")
	}
	// The user's SQL may not make a trigger of leasepool's name.
	for _, q := range []string{`CREATE TRIGGER leasepool_trg_x_insert AFTER INSERT ON orders BEGIN SELECT 1; END`} {
		err := s.InTx(t.Context(), func(tx *sqlitestore.Tx) error { _, err := tx.Exec(q); return err })
		if !errors.Is(err, task.ErrInvalid) {
			t.Errorf("InTx %s: %v; want refused", q, err)
		}
	}
}
