// schema.go is the on-disk layout: the schema and its version, the
// upgrades between versions, and the prepared statements on it.

package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
)

// schemaVersion is recorded in PRAGMA user_version.
const schemaVersion = 13

// minReadVersion is the oldest schema a read-only open reads as it is (4
// added an index, 5 changes.doc, read as NULL before it, 6 the list and
// stats indexes, which queries only run faster with, 7 lock_lines, which
// no read-only command reads, 8 the updated_at column and the partial
// indexes, which only writers and queries' speed depend on, 9 changes
// without AUTOINCREMENT, read the same, 10 the documents table, read as
// empty before it, and changes.ns, read as NULL, 11 the records moved
// into documents, read from the records table before it (documents.go),
// 12 locks and lock_lines
// by namespace, which no read-only command reads, 13 documents' terms,
// every document read as stored before them), so read-only commands work
// before a writer upgrades.
const minReadVersion = 3

var schema = `
CREATE TABLE IF NOT EXISTS tasks (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	key TEXT NOT NULL UNIQUE,
	kind TEXT NOT NULL,
	state TEXT NOT NULL,
	next_claim_at INTEGER NOT NULL,
	priority INTEGER NOT NULL,
	pinned TEXT NOT NULL,
	version INTEGER NOT NULL,
	doc TEXT NOT NULL,
	updated_at INTEGER NOT NULL DEFAULT 0
);
` + hotIndexes + listIndexes + `
CREATE TABLE IF NOT EXISTS changes (
	seq INTEGER PRIMARY KEY,
	key TEXT NOT NULL,
	doc TEXT,
	ns TEXT
);
` + taskCounts + `
` + locks + `
CREATE TABLE IF NOT EXISTS workers (
	id TEXT PRIMARY KEY,
	instance TEXT NOT NULL,
	until INTEGER NOT NULL,
	info TEXT NOT NULL
);
` + lockLines + documents + documentTerms

// documents holds task.Documents (version 10). A write of one appends a
// change whose ns is the document's namespace and key its id (ns is NULL
// for task writes), so documents share the tasks' change stream.
const documents = `
CREATE TABLE IF NOT EXISTS documents (
	namespace TEXT NOT NULL,
	id TEXT NOT NULL,
	version INTEGER NOT NULL,
	value TEXT NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (namespace, id)
) WITHOUT ROWID;
`

// documentTerms indexes task.Document.Terms (version 13): a row per
// document and term, replaced with the document in the transaction of
// each write (documents.go), so DocumentsByTerms reads a term's
// documents off the primary key. documents.terms keeps each document's
// terms (a JSON array) for reads and for the next write's difference;
// NULL marks a document stored before version 13, which has no rows
// here: the partial index finds those few (DocumentsByTerms returns them
// too, not knowing their terms), and each leaves it when next written.
const documentTerms = `
ALTER TABLE documents ADD COLUMN terms TEXT;
CREATE TABLE IF NOT EXISTS leasepool_document_terms (
	namespace TEXT NOT NULL,
	term TEXT NOT NULL,
	id TEXT NOT NULL,
	PRIMARY KEY (namespace, term, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS leasepool_documents_unindexed ON documents (namespace) WHERE terms IS NULL;
`

// taskCounts holds the number of tasks per kind and state, kept by every
// write of the tasks table in its transaction (counts.go), reserved
// documents included.
const taskCounts = `CREATE TABLE IF NOT EXISTS task_counts (
	kind TEXT NOT NULL,
	state TEXT NOT NULL,
	n INTEGER NOT NULL,
	PRIMARY KEY (kind, state)
) WITHOUT ROWID;`

// locks holds the lock keys' holders, and lockLines their waiting lines
// (task.LockLine): one place per lock key and waiting task. A key is
// named by its namespace (task.LockNamespace, empty for tasks' keys) and
// itself (version 12).
const locks = `
CREATE TABLE IF NOT EXISTS locks (
	ns TEXT NOT NULL,
	key TEXT NOT NULL,
	task_key TEXT NOT NULL,
	worker_id TEXT NOT NULL,
	attempt INTEGER NOT NULL,
	until INTEGER NOT NULL,
	instance TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (ns, key)
) WITHOUT ROWID;
`

const lockLines = `
CREATE TABLE IF NOT EXISTS lock_lines (
	ns TEXT NOT NULL,
	lock_key TEXT NOT NULL,
	task_key TEXT NOT NULL,
	priority INTEGER NOT NULL,
	seq INTEGER NOT NULL,
	until INTEGER NOT NULL,
	PRIMARY KEY (ns, lock_key, task_key)
);
CREATE INDEX IF NOT EXISTS lock_lines_rank ON lock_lines (ns, lock_key, priority DESC, seq);
`

// upgradeLocksToNamespaces moves the locks and lock_lines tables to their
// namespaced form (version 12). Keys leasepool held in the one table of
// tasks' keys move to their namespaces: rate-limit slots (rate:BUCKET#i)
// to 'rate' as BUCKET#i, the singletons' leases (leasepool.…,
// mqtt-broker:…) to 'singleton' under the same key; their holders keep
// them until they end. A line holds tasks' keys only.
const upgradeLocksToNamespaces = `
ALTER TABLE locks RENAME TO locks_v11;
ALTER TABLE lock_lines RENAME TO lock_lines_v11;
DROP INDEX IF EXISTS lock_lines_rank;
` + locks + lockLines + `
INSERT INTO locks (ns, key, task_key, worker_id, attempt, until, instance)
	SELECT CASE
		WHEN substr(key, 1, 5) = 'rate:' THEN 'rate'
		WHEN substr(key, 1, 10) = 'leasepool.' OR substr(key, 1, 12) = 'mqtt-broker:' THEN 'singleton'
		ELSE '' END,
	CASE WHEN substr(key, 1, 5) = 'rate:' THEN substr(key, 6) ELSE key END,
	task_key, worker_id, attempt, until, instance FROM locks_v11;
INSERT INTO lock_lines (ns, lock_key, task_key, priority, seq, until)
	SELECT '', lock_key, task_key, priority, seq, until FROM lock_lines_v11;
DROP TABLE locks_v11;
DROP TABLE lock_lines_v11;
`

// upgrades[v] takes a store of schema version v to v+1.
var upgrades = map[int]string{
	2: `ALTER TABLE locks ADD COLUMN instance TEXT NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, instance TEXT NOT NULL, until INTEGER NOT NULL, info TEXT NOT NULL);`,
	// Retention finds old finished tasks by state and age (delete.go).
	3: `CREATE INDEX IF NOT EXISTS tasks_state_updated ON tasks (state, unixepoch(json_extract(doc, '$.updated_at'), 'subsec'));`,
	// changes.doc: the document after the write, without its payload, so
	// that a change stream carries each write's own document (package
	// events derives a write's events from it) rather than the current one.
	4: `ALTER TABLE changes ADD COLUMN doc TEXT;`,
	5: listIndexes,
	// Lock keys served in line order across workers (locks.go).
	6: `CREATE TABLE IF NOT EXISTS lock_lines (lock_key TEXT NOT NULL, task_key TEXT NOT NULL, priority INTEGER NOT NULL,
	seq INTEGER NOT NULL, until INTEGER NOT NULL, PRIMARY KEY (lock_key, task_key));
CREATE INDEX IF NOT EXISTS lock_lines_rank ON lock_lines (lock_key, priority DESC, seq);`,
	// Claim-path indexes cover unfinished tasks only, and retention's
	// covers finished ones by a plain column (not a JSON expression
	// evaluated on every write): a claim or a finish touches fewer, smaller
	// indexes, and a claim's cost does not grow with finished tasks.
	7: `ALTER TABLE tasks ADD COLUMN updated_at INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET updated_at = CAST(round(unixepoch(json_extract(doc, '$.updated_at'), 'subsec') * 1000) AS INTEGER) * 1000000;
DROP INDEX IF EXISTS tasks_state_next_claim;
DROP INDEX IF EXISTS tasks_state_priority;
DROP INDEX IF EXISTS tasks_state_updated;
` + hotIndexes,
	// Fewer b-tree writes per task write: changes without AUTOINCREMENT,
	// whose bookkeeping row in sqlite_sequence every change rewrote (seqs
	// still never go back: a new row takes the greatest seq + 1, and
	// pruning always keeps the newest row, Config.Retention being at
	// least 1); no tasks_due (see hotIndexes); and counts per kind and
	// state in task_counts instead of the index tasks_kind_state_seq that
	// Stats scanned, which every claim and finish rewrote.
	8: `CREATE TABLE changes_v9 (seq INTEGER PRIMARY KEY, key TEXT NOT NULL, doc TEXT);
INSERT INTO changes_v9 (seq, key, doc) SELECT seq, key, doc FROM changes;
DROP TABLE changes;
ALTER TABLE changes_v9 RENAME TO changes;
DELETE FROM sqlite_sequence WHERE name = 'changes';
DROP INDEX IF EXISTS tasks_due;
` + taskCounts + `
INSERT INTO task_counts (kind, state, n) SELECT kind, state, count(*) FROM tasks GROUP BY kind, state;
DROP INDEX IF EXISTS tasks_kind_state_seq;`,
	// Documents beside tasks. The control doorbell, a cancelled task
	// before it became a document, is deleted with its count.
	9: `ALTER TABLE changes ADD COLUMN ns TEXT;
` + documents + `
UPDATE task_counts SET n = n - 1 WHERE (kind, state) IN (SELECT kind, state FROM tasks WHERE key = 'leasepool:control');
DELETE FROM tasks WHERE key = 'leasepool:control';`,
	// Shared records become documents, in the namespace recordNamespace
	// names and with the record's time as the document's updated_at; a
	// value that is not JSON, which no reader could use, is stored as
	// null. A document already there is kept.
	10: `INSERT INTO documents (namespace, id, version, value, updated_at)
	SELECT ` + recordNamespace + `, id, 1, CASE WHEN json_valid(value) THEN value ELSE 'null' END, at FROM records WHERE true
	ON CONFLICT (namespace, id) DO NOTHING;
DROP TABLE records;`,
	// Lock keys in namespaces (task.LockNamespace).
	11: upgradeLocksToNamespaces,
	// Documents' terms, indexed; the documents stored so far carry none
	// (terms NULL).
	12: documentTerms,
}

// recordNamespace is the SQL for the namespace of a shared record's
// document: its kind, with task.DocumentPrefix put before the kinds that
// lacked it (pauses, limits and the doorbell had it already).
const recordNamespace = `CASE WHEN kind IN ('schedule', 'schedule-cursor', 'device-state', 'retention') THEN 'leasepool.' || kind ELSE kind END`

// hotIndexes serve the claim path and retention (version 8; version 9
// dropped the second index on unfinished tasks, tasks_due on
// next_claim_at alone). tasks_ready is partial, so a finished task leaves
// it: the candidate queries read only what may still run, however many
// finished tasks the store keeps. It is read one priority at a time
// (candidateSQL), each a range seek on next_claim_at.
//
// A group's head (CandidateQuery.Group) has no index: it is read along
// tasks_ready, matching the group in each row's document (groupSQL), on
// the read connection. An index on the group would be written on every
// write of a document (SQLite cannot tell an expression's value kept), in
// the writer goroutine; a worker reads a group's head only when the group
// is short in its heap, and at most once a second while it is drained.
var hotIndexes = `CREATE INDEX IF NOT EXISTS tasks_ready ON tasks (priority DESC, next_claim_at) WHERE ` + unfinished + `;
CREATE INDEX IF NOT EXISTS tasks_finished_updated ON tasks (state, updated_at) WHERE ` + finished + `;
`

// groupSQL is a row's task group, from its document.
const groupSQL = `json_extract(doc, '$.group')`

// listIndexes serve List (version 6). An SQLite index ends with the
// rowid, which is seq, so each keeps its matches in seq order: a page
// filtered by state or kind is a seek plus Limit index steps, never a
// sort; one filtered by both walks the smaller of the two (see List).
// (Until version 9 an index by (kind, state) served both at once, and
// Stats' GROUP BY.)
const listIndexes = `CREATE INDEX IF NOT EXISTS tasks_state_seq ON tasks (state);
CREATE INDEX IF NOT EXISTS tasks_kind_seq ON tasks (kind);`

// migrate creates the schema in one transaction if it is missing.
func (s *Store) migrate(ctx context.Context) error {
	var v int
	if err := s.wdb.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return err
	}
	if v == schemaVersion {
		return nil
	}
	if v > schemaVersion {
		return fmt.Errorf("schema version %d is newer than this program's %d", v, schemaVersion)
	}
	unlock, err := s.lockWrites()
	if err != nil {
		return err
	}
	defer unlock()
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// Re-check under the write lock: another process may have won.
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return err
	}
	if v == schemaVersion {
		return nil
	}
	if v == 0 {
		if _, err := tx.ExecContext(ctx, schema); err != nil {
			return err
		}
	}
	for ; v > 0 && v < schemaVersion; v++ {
		if _, err := tx.ExecContext(ctx, upgrades[v]); err != nil {
			return fmt.Errorf("upgrade schema from version %d: %w", v, err)
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", schemaVersion)); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *Store) prepare(ctx context.Context) error {
	w := []struct {
		st **sql.Stmt
		q  string
	}{
		{&s.insTask, `INSERT INTO tasks (key, kind, state, next_claim_at, priority, pinned, version, doc, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT (key) DO NOTHING RETURNING seq`},
		{&s.selTaskW, `SELECT seq, version, doc FROM tasks WHERE key = ?`},
		{&s.updTask, `UPDATE tasks SET kind = ?, state = ?, next_claim_at = ?, priority = ?, pinned = ?,
			version = version + 1, doc = ?, updated_at = ? WHERE key = ? AND version = ?`},
		{&s.updHot, `UPDATE tasks SET state = ?, next_claim_at = ?, version = version + 1, doc = ?, updated_at = ?
			WHERE seq = ? AND key = ? AND version = ? AND kind = ? AND priority = ? AND pinned = ?`},
		{&s.existsW, `SELECT 1 FROM tasks WHERE key = ?`},
		{&s.insChange, `INSERT INTO changes (key, doc) VALUES (?, ?)`},
		{&s.insDocChange, `INSERT INTO changes (key, doc, ns) VALUES (?, ?, ?)`},
		{&s.pruneChanges, `DELETE FROM changes WHERE seq <= ?`},
		{&s.selStored, `SELECT kind, state FROM tasks WHERE key = ? AND version = ?`},
		{&s.userVersion, `PRAGMA user_version`},
		{&s.upsertCount, `INSERT INTO task_counts (kind, state, n) VALUES (?, ?, ?)
			ON CONFLICT (kind, state) DO UPDATE SET n = n + excluded.n`},
		{&s.selLock, `SELECT task_key, worker_id, attempt, instance, until FROM locks WHERE ns = ? AND key = ?`},
		{&s.upsertLock, `INSERT INTO locks (ns, key, task_key, worker_id, attempt, instance, until) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (ns, key) DO UPDATE SET task_key = excluded.task_key, worker_id = excluded.worker_id,
			attempt = excluded.attempt, instance = excluded.instance, until = excluded.until`},
		{&s.delLock, `DELETE FROM locks WHERE ns = ? AND key = ? AND task_key = ? AND worker_id = ? AND attempt = ? AND instance = ?`},
		// The first live place ahead of (priority, seq) whose task is still
		// to run: a finished or cancelled task's place never blocks.
		{&s.selAhead, `SELECT l.task_key, l.until FROM lock_lines l JOIN tasks t ON t.key = l.task_key
			WHERE l.ns = ? AND l.lock_key = ? AND l.task_key <> ? AND l.until > ? AND (l.priority > ? OR (l.priority = ? AND l.seq < ?))
			AND t.` + unfinished + ` ORDER BY l.priority DESC, l.seq LIMIT 1`},
		{&s.upsertPlace, `INSERT INTO lock_lines (ns, lock_key, task_key, priority, seq, until) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (ns, lock_key, task_key) DO UPDATE SET priority = excluded.priority, seq = excluded.seq, until = excluded.until`},
		{&s.delPlace, `DELETE FROM lock_lines WHERE ns = ? AND lock_key = ? AND task_key = ?`},
		{&s.pruneLine, `DELETE FROM lock_lines WHERE ns = ? AND lock_key = ? AND until <= ?`},
		{&s.selDocTerms, `SELECT version, terms FROM documents WHERE namespace = ? AND id = ?`},
		// A document's terms in and out of the index, a JSON array of them
		// at once.
		{&s.insTerms, `INSERT INTO leasepool_document_terms (namespace, term, id) SELECT ?, value, ? FROM json_each(?) WHERE true
			ON CONFLICT (namespace, term, id) DO NOTHING`},
		{&s.delTerms, `DELETE FROM leasepool_document_terms WHERE namespace = ? AND id = ? AND term IN (SELECT value FROM json_each(?))`},
	}
	for _, p := range w {
		st, err := s.wdb.PrepareContext(ctx, p.q)
		if err != nil {
			return err
		}
		*p.st = st
	}
	return s.prepareRead(ctx, schemaVersion)
}

// prepareRead prepares the statements on rdb for a file of schema version
// v (older ones only when read-only).
func (s *Store) prepareRead(ctx context.Context, v int) error {
	s.readVersion = v
	changeDoc, changeNS := "c.doc", "c.ns"
	if v < 5 {
		changeDoc = "NULL" // no changes.doc yet: readers fall back to the current document
	}
	if v < 10 {
		changeNS = "NULL" // no documents yet
	}
	r := []struct {
		st **sql.Stmt
		q  string
	}{
		{&s.selTask, `SELECT seq, version, doc FROM tasks WHERE key = ?`},
		{&s.selChanges, `SELECT c.seq, c.key, ` + changeDoc + `, ` + changeNS + `, t.seq, t.version, t.doc, t.kind, t.state FROM changes c
			LEFT JOIN tasks t ON t.key = c.key AND ` + changeNS + ` IS NULL WHERE c.seq > ? ORDER BY c.seq LIMIT ?`},
		{&s.maxChange, `SELECT COALESCE(MAX(seq), 0) FROM changes`},
		{&s.minChange, `SELECT COALESCE(MIN(seq), 0) FROM changes`},
	}
	for _, p := range r {
		st, err := s.rdb.PrepareContext(ctx, p.q)
		if err != nil {
			return err
		}
		*p.st = st
	}
	return nil
}
