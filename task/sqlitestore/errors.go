// errors.go maps SQLite driver errors onto the task sentinels and holds
// this backend's own sentinel errors.

package sqlitestore

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/leasepool/leasepool/task"
)

// ErrReadOnly is returned by writes to a Store opened with Config.ReadOnly.
var ErrReadOnly = errors.New("sqlitestore: store opened read-only")

// ErrSchemaChanged fails the writes of a process whose store file was
// upgraded to a newer schema by a newer program since it opened it: its
// writes would no longer keep what the new schema keeps (task_counts, say).
// Restart the process with the newer program.
var ErrSchemaChanged = errors.New("sqlitestore: the store's schema was upgraded by a newer leasepool since this process opened it; restart it with that version")

// errClosed is returned by every call after Close.
var errClosed = fmt.Errorf("sqlitestore: %w", task.ErrClosed)

// mapErr turns driver errors into the task sentinels, once. A unique
// constraint violation cannot reach it: Insert resolves it with ON CONFLICT.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("sqlitestore: database busy: %w", err)
		case sqlite3.SQLITE_NOTADB:
			return errors.New("file is not a database")
		case sqlite3.SQLITE_CONSTRAINT:
			return fmt.Errorf("sqlitestore: %w: %w", task.ErrConflict, err)
		}
		return err
	}
	if errors.Is(err, sql.ErrConnDone) || strings.Contains(err.Error(), "sql: database is closed") {
		return errClosed
	}
	return err
}

var errStreamClosed = fmt.Errorf("sqlitestore: change stream: %w", task.ErrClosed)
