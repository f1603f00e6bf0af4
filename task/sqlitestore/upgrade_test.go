package sqlitestore_test

import (
	"database/sql"
	"path/filepath"
	"testing"

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
	if _, err := db.Exec(`DROP INDEX tasks_state_updated; ALTER TABLE changes DROP COLUMN doc; PRAGMA user_version = 3`); err != nil {
		t.Fatal(err)
	}
	ro, err := sqlitestore.Open(t.Context(), path, &sqlitestore.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a version 3 store: %v", err)
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
	var docs int
	if err := db.QueryRow(`SELECT count(*) FROM pragma_table_info('changes') WHERE name = 'doc'`).Scan(&docs); err != nil {
		t.Fatal(err)
	}
	var lines int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'lock_lines'`).Scan(&lines); err != nil {
		t.Fatal(err)
	}
	if v != 6 || n != 1 || docs != 1 || lines != 1 {
		t.Errorf("after a writer's open: version %d, retention index %d, changes.doc %d, lock_lines %d, want 6, 1, 1 and 1", v, n, docs, lines)
	}
}
