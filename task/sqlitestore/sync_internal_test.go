package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
)

// TestEveryConnectionSyncs: every connection the store opens (the writer,
// the checkpointer, each reader, and one the pool opens later to replace
// a broken one) runs with the configured synchronous setting, FULL (2)
// unless the config asks for NORMAL (1). A connection left at NORMAL in
// WAL mode would let a commit it makes, or the checkpoint it runs when it
// is the last to close, lose writes that returned on power loss.
func TestEveryConnectionSyncs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sync Synchronous
		want int
	}{{"", 2}, {SyncFull, 2}, {SyncNormal, 1}} {
		t.Run(fmt.Sprintf("%q", c.sync), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "s.db")
			s, err := Open(ctx, path, &Config{Synchronous: c.sync})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			publish(t, s, "before")
			checkPool(t, "writer", s.wdb, 1, c.want)
			checkPool(t, "checkpointer", s.cdb, 1, c.want)
			checkPool(t, "readers", s.rdb, readConns, c.want)
			publish(t, s, "after") // the replaced writer connection still writes

			// A read-only open, while the file is live (-wal present) and
			// once it is not (read as immutable).
			r, err := Open(ctx, path, &Config{Synchronous: c.sync, ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			checkPool(t, "read-only store, live file", r.rdb, readConns, c.want)
			r.Close()
			s.Close()
			if _, err := os.Stat(path + "-wal"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("-wal after the last close: %v, want it removed (the next open reads the file as immutable)", err)
			}
			r, err = Open(ctx, path, &Config{Synchronous: c.sync, ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			checkPool(t, "read-only store, closed file", r.rdb, readConns, c.want)
		})
	}
}

func publish(t *testing.T, s *Store, key string) {
	t.Helper()
	if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: key, Kind: "k"}); err != nil {
		t.Fatal(err)
	}
}

// checkPool holds all n connections of db at once (so the pool must open
// each) and checks PRAGMA synchronous on each, then breaks one and checks
// the connection the pool opens in its place.
func checkPool(t *testing.T, name string, db *sql.DB, n, want int) {
	t.Helper()
	ctx := t.Context()
	seen := map[any]bool{}
	conns := make([]*sql.Conn, n)
	for i := range conns {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		conns[i] = conn
		seen[driverConn(t, conn)] = true
		checkSync(t, fmt.Sprintf("%s, connection %d", name, i), conn, want)
	}
	if len(seen) != n {
		t.Fatalf("%s: %d distinct connections of %d held", name, len(seen), n)
	}
	// ErrBadConn from Raw makes the pool close the connection.
	if err := conns[0].Raw(func(any) error { return driver.ErrBadConn }); !errors.Is(err, driver.ErrBadConn) {
		t.Fatalf("%s: breaking a connection: %v", name, err)
	}
	conns[0].Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if seen[driverConn(t, conn)] {
		t.Fatalf("%s: the pool handed back the broken connection", name)
	}
	checkSync(t, name+", connection opened later", conn, want)
	conn.Close()
	for _, c := range conns[1:] {
		c.Close()
	}
}

func driverConn(t *testing.T, conn *sql.Conn) (dc any) {
	t.Helper()
	if err := conn.Raw(func(c any) error { dc = c; return nil }); err != nil {
		t.Fatal(err)
	}
	return dc
}

func checkSync(t *testing.T, name string, conn *sql.Conn, want int) {
	t.Helper()
	var got int
	if err := conn.QueryRowContext(context.Background(), "PRAGMA synchronous").Scan(&got); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if got != want {
		t.Errorf("%s: PRAGMA synchronous = %d, want %d", name, got, want)
	}
}

// TestBadSynchronousRefused: a setting other than full or normal is
// refused before anything is opened, naming the field.
func TestBadSynchronousRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, v := range []Synchronous{"off", "FULL", "extra", "2"} {
		s, err := Open(t.Context(), filepath.Join(dir, "s.db"), &Config{Synchronous: v})
		if err == nil {
			s.Close()
			t.Fatalf("Synchronous %q: opened", v)
		}
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "Synchronous") {
			t.Errorf("Synchronous %q: %v, want ErrInvalid naming Synchronous", v, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused opens left %d files", len(entries))
	}
}
