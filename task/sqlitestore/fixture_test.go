package sqlitestore_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"
)

// copyFixture copies testdata/name, a store file an older schema wrote, to
// t's temporary directory, and returns the copy's path, for a test to
// upgrade.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	fixture, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "s.db")
	if err := os.WriteFile(path, fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rawDB opens the store file at path as a plain SQLite database, to read
// what the store wrote; it is closed when t ends.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
