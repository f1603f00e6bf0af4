package sqlitestore_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestUpgradeFromVersion3 opens a store of schema version 3 (before the
// retention index and changes.doc): read-only opens read it as it is, a
// writer upgrades it.
func TestUpgradeFromVersion3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DROP INDEX tasks_state_updated; DROP INDEX tasks_state_seq; DROP INDEX tasks_kind_seq; DROP INDEX tasks_kind_state_seq; ALTER TABLE changes DROP COLUMN doc; PRAGMA user_version = 3`); err != nil {
		t.Fatal(err)
	}
	ro, err := sqlitestore.Open(t.Context(), path, &sqlitestore.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a version 3 store: %v", err)
	}
	// The list queries only run faster with version 6's indexes.
	if _, err := ro.List(t.Context(), task.ListQuery{Kind: "k", State: task.StatePending, Desc: true, Limit: 5}); err != nil {
		t.Errorf("List on a version 3 store: %v", err)
	}
	if _, err := ro.Stats(t.Context()); err != nil {
		t.Errorf("Stats on a version 3 store: %v", err)
	}
	ro.Close()
	rw, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	rw.Close()
	var v, n int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'tasks_state_updated'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var listIdx int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name IN ('tasks_state_seq', 'tasks_kind_seq', 'tasks_kind_state_seq')`).Scan(&listIdx); err != nil {
		t.Fatal(err)
	}
	var docs int
	if err := db.QueryRow(`SELECT count(*) FROM pragma_table_info('changes') WHERE name = 'doc'`).Scan(&docs); err != nil {
		t.Fatal(err)
	}
	if v != 6 || n != 1 || docs != 1 || listIdx != 3 {
		t.Errorf("after a writer's open: version %d, retention index %d, changes.doc %d, list indexes %d, want 6, 1, 1 and 3", v, n, docs, listIdx)
	}
}
