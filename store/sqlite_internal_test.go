package store

import (
	"testing"

	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestSQLiteConfig: the file and the synchronous setting an embedded store
// URL names (what follows "sqlite:").
func TestSQLiteConfig(t *testing.T) {
	for rest, want := range map[string]struct {
		path string
		sync sqlitestore.Synchronous
	}{
		"x.db":                     {"x.db", ""},
		"x.db?":                    {"x.db", ""},
		"/d/x.db?synchronous=full": {"/d/x.db", sqlitestore.SyncFull},
		"d/x.db?synchronous=FULL":  {"d/x.db", sqlitestore.SyncFull},
		"x.db?synchronous=normal":  {"x.db", sqlitestore.SyncNormal},
		"x.db?synchronous=Normal":  {"x.db", sqlitestore.SyncNormal},
	} {
		path, cfg, err := sqliteConfig(rest)
		if err != nil || path != want.path || cfg.Synchronous != want.sync {
			t.Errorf("sqliteConfig(%q) = %q, %q, %v; want %q, %q", rest, path, cfg.Synchronous, err, want.path, want.sync)
		}
		if path, ok := SQLiteFile("sqlite:" + rest); !ok || path != want.path {
			t.Errorf("SQLiteFile(sqlite:%s) = %q, %v; want %q", rest, path, ok, want.path)
		}
	}
	if path, ok := SQLiteFile("mongodb://h/db?x=1"); ok {
		t.Errorf("SQLiteFile(mongodb://...) = %q, true; want false", path)
	}
}
