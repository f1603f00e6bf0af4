// guard.go keeps the user's SQL (InTx) off leasepool's own tables: an
// SQLite authorizer on the write connection refuses, while a user's
// statement is compiled, every statement that names leasepool's tables or
// indexes, ends or nests the writer's transaction, or changes the
// connection's settings.

package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite"

	"github.com/leasepool/leasepool/task"
)

// ReservedPrefix starts the names of the tables and indexes later
// versions of leasepool may add to the store's file; ReservedNames are the
// ones it has. The user's SQL run by InTx may not name them.
const ReservedPrefix = "leasepool_"

// ReservedNames are the tables and indexes of leasepool's own in the
// store's file, and the ones older versions had (an upgrade still makes
// or drops them).
var ReservedNames = []string{
	"tasks", "changes", "task_counts", "locks", "lock_lines", "workers", "documents", "clock",
	"tasks_ready", "tasks_finished_updated", "tasks_state_seq", "tasks_kind_seq", "lock_lines_rank",
	"records", "changes_v9", "locks_v11", "lock_lines_v11",
	"tasks_state_next_claim", "tasks_state_priority", "tasks_state_updated", "tasks_due", "tasks_kind_state_seq",
}

var reservedSet = func() map[string]bool {
	m := make(map[string]bool, len(ReservedNames))
	for _, n := range ReservedNames {
		m[n] = true
	}
	return m
}()

// Reserved reports whether name (of a table, index, view or trigger) is
// leasepool's in the store's file.
func Reserved(name string) bool {
	n := strings.ToLower(name)
	return reservedSet[n] || strings.HasPrefix(n, ReservedPrefix)
}

// infoPragmas are the pragmas the user's SQL may run: they only read the
// schema.
var infoPragmas = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true, "index_list": true,
	"index_info": true, "index_xinfo": true, "foreign_key_list": true,
}

// authorize is the write connection's authorizer. It allows everything
// but while the writer compiles a user's statement (s.guarding, set and
// read on the writer goroutine alone: SQLite calls it from the prepare
// that goroutine runs). A refusal is recorded in s.refused, for the
// error to name what was refused rather than SQLite's "not authorized".
func (s *Store) authorize(action sqlite.AuthorizerActionCode, arg1, arg2, _, _ string) sqlite.AuthorizerReturnCode {
	if !s.guarding {
		return sqlite.AuthorizerOK
	}
	deny := func(why string) sqlite.AuthorizerReturnCode {
		if s.refused == "" {
			s.refused = why
		}
		return sqlite.AuthorizerDeny
	}
	switch action {
	case sqlite.AuthTransaction, sqlite.AuthSavepoint:
		return deny("transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE): InTx commits or rolls back as its function returns")
	case sqlite.AuthAttach, sqlite.AuthDetach:
		return deny("ATTACH and DETACH")
	case sqlite.AuthPragma:
		if !infoPragmas[strings.ToLower(arg1)] {
			return deny(fmt.Sprintf("PRAGMA %s: only the schema's info pragmas are allowed", arg1))
		}
	case sqlite.AuthRead, sqlite.AuthAnalyze, sqlite.AuthReindex:
		// arg1 is the table (or index); a read's arg2 is a column, which
		// may bear any name.
		if Reserved(arg1) {
			return deny(fmt.Sprintf("table %s is leasepool's", arg1))
		}
	case sqlite.AuthInsert, sqlite.AuthUpdate, sqlite.AuthDelete:
		if Reserved(arg1) {
			return deny(fmt.Sprintf("table %s is leasepool's", arg1))
		}
		if strings.EqualFold(arg1, "sqlite_sequence") {
			return deny("table sqlite_sequence holds leasepool's publish order")
		}
	case sqlite.AuthAlterTable:
		if Reserved(arg2) {
			return deny(fmt.Sprintf("table %s is leasepool's", arg2))
		}
	case sqlite.AuthFunction, sqlite.AuthSelect, sqlite.AuthRecursive:
	default:
		// Creating and dropping tables, indexes, views and triggers: arg1
		// names the object, arg2 the table an index or trigger is on.
		for _, n := range []string{arg1, arg2} {
			if Reserved(n) {
				return deny(fmt.Sprintf("name %s is leasepool's (reserved: %s and names starting with %s)",
					n, strings.Join(ReservedNames[:8], ", "), ReservedPrefix))
			}
		}
	}
	return sqlite.AuthorizerOK
}

// guarded runs a user's statement with the guard on, and turns a refusal
// into an error wrapping task.ErrInvalid that names what was refused.
func (s *Store) guarded(query string, run func() error) error {
	s.guarding, s.refused = true, ""
	err := run()
	refused := s.refused
	s.guarding, s.refused = false, ""
	if err != nil && refused != "" {
		return fmt.Errorf("%w: sql: %s (%q)", task.ErrInvalid, refused, cut(query, 80))
	}
	return err
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// guardedConnector opens the write connection with s.authorize installed,
// on every physical connection database/sql opens (one, for the Store's
// life, unless it is ever reopened), so the guard cannot be missing.
type guardedConnector struct {
	driver.Connector
	auth sqlite.AuthorizerFn
}

func (c guardedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	r, ok := conn.(sqlite.AuthorizerRegisterer)
	if !ok {
		conn.Close()
		return nil, errors.New("sqlitestore: the SQLite driver offers no authorizer")
	}
	if err := r.RegisterAuthorizer(c.auth); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// openGuardedDB is openDB for the write connection, with s's authorizer.
func (s *Store) openGuardedDB(dsn string) (*sql.DB, error) {
	base, err := sqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(guardedConnector{Connector: base, auth: s.authorize})
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	return db, nil
}
