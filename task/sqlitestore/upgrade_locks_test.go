package sqlitestore_test

import (
	"testing"

	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
)

// TestUpgradeMovesLocksToNamespaces opens testdata/v10-locks.db, written
// by the program of schema version 10 while holding a task's lock key and
// its line, a rate-limit slot and three singletons' leases in its one
// lock table (see storetest.UpgradedLocks), and checks that the upgrade
// moves the slot and the leases to their namespaces, held as before.
func TestUpgradeMovesLocksToNamespaces(t *testing.T) {
	path := copyFixture(t, "v10-locks.db")
	st, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db := rawDB(t, path)
	var v, rows int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != sqlitestore.SchemaVersion {
		t.Fatalf("user_version after the upgrade: %d, %v; want %d", v, err, sqlitestore.SchemaVersion)
	}
	if err := db.QueryRow(`SELECT count(*) FROM locks`).Scan(&rows); err != nil || rows != 5 {
		t.Fatalf("locks after the upgrade: %d rows, %v; want the 5 held before", rows, err)
	}
	storetest.UpgradedLocks(t, st)
}
