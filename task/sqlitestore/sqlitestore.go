// Package sqlitestore is leasepool's embedded backend: a task.Store kept in
// one SQLite file (modernc.org/sqlite, WAL mode) for a single box without
// MongoDB. Several processes may open the same file. Every task write also
// appends a row to a changes table in the same transaction; watchers in the
// same process are woken at once after each commit, and watchers in other
// processes tail that table by sequence number, woken by file notifications
// on the database directory and by a polling fallback.
package sqlitestore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/leasepool/leasepool/task"
)

var (
	_ task.Store       = (*Store)(nil)
	_ task.RecordStore = (*Store)(nil)
)

// schemaVersion is recorded in PRAGMA user_version.
const schemaVersion = 4

// minReadVersion is the oldest schema a read-only open reads as it is (4
// only added an index), so read-only commands work before a writer upgrades.
const minReadVersion = 3

// Config tunes a Store. The zero value (or nil) takes every default.
type Config struct {
	// Logger receives background errors. Default slog.Default().
	Logger *slog.Logger
	// PollInterval is how often watchers look for changes written by other
	// processes when no file notification woke them. Default 25ms; must
	// not be negative.
	PollInterval time.Duration
	// Retention is how many change rows are kept for resuming watchers;
	// older ones are pruned and resuming before them gives
	// task.ErrHistoryLost. Default 100000; must not be negative.
	Retention int
	// Clock is the local wall clock. Default time.Now. It does not drive
	// Store.Now (see clock.go): it seeds a new clock epoch and is compared
	// with the store clock, with a warning when they disagree.
	Clock func() time.Time
	// ReadOnly opens an existing store for reading only, for tools that
	// only look: the file is opened with mode=ro, no schema is created, the
	// journal mode is left as it is and no -lock file is made. A file
	// without a leasepool schema is refused untouched. Every write returns
	// an error wrapping ErrReadOnly.
	ReadOnly bool

	host *hostClock // test hook: the host's boot clock; nil is the real one
}

// ErrReadOnly is returned by writes to a Store opened with Config.ReadOnly.
var ErrReadOnly = errors.New("sqlitestore: store opened read-only")

func (c *Config) validate() error {
	if c.PollInterval < 0 {
		return fmt.Errorf("%w: sqlitestore config: PollInterval (%s) must not be negative", task.ErrInvalid, c.PollInterval)
	}
	if c.Retention < 0 {
		return fmt.Errorf("%w: sqlitestore config: Retention (%d) must not be negative", task.ErrInvalid, c.Retention)
	}
	return nil
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.PollInterval == 0 {
		out.PollInterval = 25 * time.Millisecond
	}
	if out.Retention == 0 {
		out.Retention = 100000
	}
	if out.Clock == nil {
		out.Clock = time.Now
	}
	return out
}

// Store is a task.Store on one SQLite file. It is safe for concurrent use.
type Store struct {
	path string
	cfg  Config
	log  *slog.Logger

	wdb *sql.DB // one connection: every write transaction
	// writeLock is flock(2)ed around every write transaction. SQLite's own
	// busy handler sleeps and polls (up to 100 ms a nap), so under
	// contention from other processes a writer can starve for seconds and
	// miss its lease; a blocking flock hands the lock over at once.
	writeLock *os.File
	wmu       sync.Mutex // holds writeLock within this process
	writeQ    chan *writeReq
	rdb       *sql.DB // several read-only connections

	// Prepared statements on wdb.
	insTask, selTaskW, updTask, existsW, insChange, pruneChanges *sql.Stmt
	selLock, upsertLock, delLock                                 *sql.Stmt
	// Prepared statements on rdb.
	selTask, selChanges, maxChange, minChange *sql.Stmt

	writes     atomic.Int64 // task writes by this Store, for pruning
	pruneEvery int64

	mu     sync.Mutex
	wake   chan struct{} // closed and replaced after each known change
	latest int64         // highest change seq known to this Store

	// recent holds the documents this Store wrote, by change seq, so that
	// its own watchers need not decode them again (a worker sees mostly its
	// own claims and finishes). Shared read-only with every stream.
	recentMu sync.Mutex
	recent   map[int64]*task.Task
	ring     [recentSize]int64
	ringPos  int

	watchers atomic.Int64
	closed   atomic.Bool
	done     chan struct{}
	bg       sync.WaitGroup
	closeMu  sync.Mutex

	clock storeClock // see clock.go
}

// Open opens (creating if missing) the store in the SQLite file at path.
// A file that is not a SQLite database is refused and left untouched.
func Open(ctx context.Context, path string, cfg *Config) (*Store, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	if err := checkHeader(path); err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	s := &Store{
		path:       path,
		cfg:        c,
		log:        c.Logger.With(slog.String("store", path)),
		wake:       make(chan struct{}),
		done:       make(chan struct{}),
		pruneEvery: int64(min(1000, max(1, c.Retention/10))),
	}
	if c.ReadOnly {
		if err := s.openReadOnly(ctx); err != nil {
			s.closeDBs()
			return nil, fmt.Errorf("open store %s: %w", path, mapErr(err))
		}
		s.initClock(ctx)
		if err := s.startTail(); err != nil {
			close(s.done)
			s.bg.Wait()
			s.closeDBs()
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
		return s, nil
	}
	_, statErr := os.Stat(path + "-lock")
	if err := s.open(ctx); err != nil {
		s.closeDBs()
		if errors.Is(statErr, os.ErrNotExist) {
			os.Remove(path + "-lock") // leave a refused file's directory as it was
		}
		return nil, fmt.Errorf("open store %s: %w", path, mapErr(err))
	}
	s.initClock(ctx)
	s.writeQ = make(chan *writeReq, maxBatch)
	s.bg.Add(1)
	go s.writer()
	if err := s.startTail(); err != nil {
		close(s.done)
		s.bg.Wait()
		s.closeDBs()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

// sqliteHeader starts every SQLite database file.
var sqliteHeader = []byte("SQLite format 3\x00")

// checkHeader refuses an existing non-empty file that is not a SQLite
// database before the driver touches it (setting WAL mode would write).
func checkHeader(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var b [16]byte
	n, err := io.ReadFull(f, b[:])
	if n == 0 && (err == io.EOF) {
		return nil // empty file: a new database
	}
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	if !bytes.Equal(b[:n], sqliteHeader) {
		return errors.New("file is not a database")
	}
	return nil
}

// openReadOnly opens rdb alone, with mode=ro, and checks that the file
// holds this program's schema.
func (s *Store) openReadOnly(ctx context.Context) error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		return errors.New("not a leasepool store (empty file)")
	}
	// A read-only connection to a WAL database creates the -wal and -shm
	// files when they are missing (and cannot remove them on close). They
	// are missing only when no connection has the database open, so the
	// main file then holds every commit and is read as immutable: no
	// locks, no files. A writer that starts and checkpoints during the
	// read could tear it (an error, never a write).
	q := "?mode=ro&_pragma=busy_timeout(10000)&_pragma=query_only(1)"
	if _, err := os.Stat(s.path + "-wal"); errors.Is(err, os.ErrNotExist) {
		q = "?mode=ro&immutable=1&_pragma=query_only(1)"
	}
	if s.rdb, err = sql.Open("sqlite", "file:"+filepath.ToSlash(s.path)+q); err != nil {
		return err
	}
	s.rdb.SetMaxOpenConns(8)
	s.rdb.SetMaxIdleConns(8)
	s.rdb.SetConnMaxIdleTime(0)
	s.rdb.SetConnMaxLifetime(0)
	var v int
	if err := s.rdb.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return err
	}
	if v < minReadVersion || v > schemaVersion {
		if v == 0 {
			return errors.New("not a leasepool store (no leasepool schema)")
		}
		return fmt.Errorf("not a store of this program (schema version %d, want %d)", v, schemaVersion)
	}
	return s.prepareRead(ctx)
}

func dsn(path string, readOnly bool) string {
	q := "?_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(0)&_txlock=immediate"
	if readOnly {
		q = "?_pragma=busy_timeout(10000)&_pragma=query_only(1)"
	} else {
		q += "&_pragma=journal_mode(WAL)"
	}
	return "file:" + filepath.ToSlash(path) + q
}

func (s *Store) open(ctx context.Context) error {
	var err error
	if s.writeLock, err = os.OpenFile(s.path+"-lock", os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		return err
	}
	if s.wdb, err = sql.Open("sqlite", dsn(s.path, false)); err != nil {
		return err
	}
	s.wdb.SetMaxOpenConns(1)
	s.wdb.SetMaxIdleConns(1)
	s.wdb.SetConnMaxLifetime(0)
	s.wdb.SetConnMaxIdleTime(0)
	if err := s.migrate(ctx); err != nil {
		return err
	}
	if s.rdb, err = sql.Open("sqlite", dsn(s.path, true)); err != nil {
		return err
	}
	s.rdb.SetMaxOpenConns(8)
	s.rdb.SetMaxIdleConns(8)
	s.rdb.SetConnMaxIdleTime(0)
	s.rdb.SetConnMaxLifetime(0)
	return s.prepare(ctx)
}

const schema = `
CREATE TABLE IF NOT EXISTS tasks (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	key TEXT NOT NULL UNIQUE,
	kind TEXT NOT NULL,
	state TEXT NOT NULL,
	next_claim_at INTEGER NOT NULL,
	priority INTEGER NOT NULL,
	pinned TEXT NOT NULL,
	version INTEGER NOT NULL,
	doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_state_next_claim ON tasks (state, next_claim_at);
CREATE INDEX IF NOT EXISTS tasks_state_priority ON tasks (state, priority DESC, seq);
CREATE INDEX IF NOT EXISTS tasks_state_updated ON tasks (state, unixepoch(json_extract(doc, '$.updated_at'), 'subsec'));
CREATE TABLE IF NOT EXISTS changes (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	key TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
	kind TEXT NOT NULL,
	id TEXT NOT NULL,
	at INTEGER NOT NULL,
	value TEXT NOT NULL,
	PRIMARY KEY (kind, id)
);
CREATE TABLE IF NOT EXISTS locks (
	key TEXT PRIMARY KEY,
	task_key TEXT NOT NULL,
	worker_id TEXT NOT NULL,
	attempt INTEGER NOT NULL,
	until INTEGER NOT NULL,
	instance TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS workers (
	id TEXT PRIMARY KEY,
	instance TEXT NOT NULL,
	until INTEGER NOT NULL,
	info TEXT NOT NULL
);
`

// upgrades[v] takes a store of schema version v to v+1.
var upgrades = map[int]string{
	2: `ALTER TABLE locks ADD COLUMN instance TEXT NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, instance TEXT NOT NULL, until INTEGER NOT NULL, info TEXT NOT NULL);`,
	// Retention finds old finished tasks by state and age (delete.go).
	3: `CREATE INDEX IF NOT EXISTS tasks_state_updated ON tasks (state, unixepoch(json_extract(doc, '$.updated_at'), 'subsec'));`,
}

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
		{&s.insTask, `INSERT INTO tasks (key, kind, state, next_claim_at, priority, pinned, version, doc)
			VALUES (?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT (key) DO NOTHING RETURNING seq`},
		{&s.selTaskW, `SELECT seq, version, doc FROM tasks WHERE key = ?`},
		{&s.updTask, `UPDATE tasks SET kind = ?, state = ?, next_claim_at = ?, priority = ?, pinned = ?,
			version = version + 1, doc = ? WHERE key = ? AND version = ?`},
		{&s.existsW, `SELECT 1 FROM tasks WHERE key = ?`},
		{&s.insChange, `INSERT INTO changes (key) VALUES (?) RETURNING seq`},
		{&s.pruneChanges, `DELETE FROM changes WHERE seq <= ?`},
		{&s.selLock, `SELECT task_key, worker_id, attempt, instance, until FROM locks WHERE key = ?`},
		{&s.upsertLock, `INSERT INTO locks (key, task_key, worker_id, attempt, instance, until) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (key) DO UPDATE SET task_key = excluded.task_key, worker_id = excluded.worker_id,
			attempt = excluded.attempt, instance = excluded.instance, until = excluded.until`},
		{&s.delLock, `DELETE FROM locks WHERE key = ? AND task_key = ? AND worker_id = ? AND attempt = ? AND instance = ?`},
	}
	for _, p := range w {
		st, err := s.wdb.PrepareContext(ctx, p.q)
		if err != nil {
			return err
		}
		*p.st = st
	}
	return s.prepareRead(ctx)
}

// prepareRead prepares the statements on rdb.
func (s *Store) prepareRead(ctx context.Context) error {
	r := []struct {
		st **sql.Stmt
		q  string
	}{
		{&s.selTask, `SELECT seq, version, doc FROM tasks WHERE key = ?`},
		{&s.selChanges, `SELECT c.seq, c.key, t.seq, t.version, t.doc FROM changes c
			LEFT JOIN tasks t ON t.key = c.key WHERE c.seq > ? ORDER BY c.seq LIMIT ?`},
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

// Close stops the background goroutines, ends open change streams and
// closes the database. It may be called more than once.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	// Order: stop the tail goroutine (it reads through rdb), wake the
	// streams so they see the store closed, then close the databases.
	close(s.done)
	s.bg.Wait()
	s.broadcast(0)
	return s.closeDBs()
}

// lockWrites takes the cross-process write lock (see Store.writeLock).
func (s *Store) lockWrites() (unlock func(), err error) {
	s.wmu.Lock()
	if err := syscall.Flock(int(s.writeLock.Fd()), syscall.LOCK_EX); err != nil {
		s.wmu.Unlock()
		return nil, fmt.Errorf("lock %s: %w", s.writeLock.Name(), err)
	}
	return func() {
		syscall.Flock(int(s.writeLock.Fd()), syscall.LOCK_UN)
		s.wmu.Unlock()
	}, nil
}

func (s *Store) closeDBs() error {
	var errs []error
	if s.writeLock != nil {
		errs = append(errs, s.writeLock.Close())
	}
	for _, db := range []*sql.DB{s.rdb, s.wdb} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	return errors.Join(errs...)
}

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

// nanos stores a time as unix nanoseconds; the zero time is 0.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func pinned(t *task.Task) (string, error) {
	if len(t.SpecificWorkerIDs) == 0 {
		return "", nil
	}
	b, err := json.Marshal(t.SpecificWorkerIDs)
	return string(b), err
}

// decode reads a stored row: the doc plus the columns that own ID, Seq and
// Version.
func decode(seq, version int64, doc string) (*task.Task, error) {
	t := new(task.Task)
	if err := json.Unmarshal([]byte(doc), t); err != nil {
		return nil, fmt.Errorf("sqlitestore: decode task seq %d: %w", seq, err)
	}
	t.ID = strconv.FormatInt(seq, 10)
	t.Seq = seq
	t.Version = version
	return t, nil
}

type rowScanner interface{ Scan(dest ...any) error }

func scanTask(r rowScanner) (*task.Task, error) {
	var seq, version int64
	var doc string
	if err := r.Scan(&seq, &version, &doc); err != nil {
		return nil, err
	}
	return decode(seq, version, doc)
}

// write runs fn in a write transaction and, when fn appended change rows,
// wakes the in-process watchers after the commit. Concurrent callers are
// group-committed: the writer goroutine runs up to maxBatch of them in one
// transaction, each inside its own savepoint so that one caller's error
// undoes only its own work. A commit is what costs (a WAL append and the
// cross-process lock), so batching multiplies write throughput without
// changing any caller's all-or-nothing outcome.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) (change int64, err error)) error {
	return s.submit(&writeReq{ctx: ctx, fn: fn})
}

// writeAtomic is write for a fn of several statements that must all
// apply or none: it runs inside its own savepoint.
func (s *Store) writeAtomic(ctx context.Context, fn func(tx *sql.Tx) (change int64, err error)) error {
	return s.submit(&writeReq{ctx: ctx, fn: fn, savepoint: true})
}

func (s *Store) submit(req *writeReq) error {
	if s.closed.Load() {
		return errClosed
	}
	if s.cfg.ReadOnly {
		return ErrReadOnly
	}
	ctx := req.ctx
	req.done = make(chan error, 1)
	select {
	case s.writeQ <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errClosed
	}
	// The writer answers every request it takes; one sent as the store
	// closed may never be taken, and a caller's deadline is its own (a
	// lease renewal must not wait past its lease), so stop waiting on
	// either. The outcome is then unknown, as with any store error.
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		select {
		case err := <-req.done:
			return err
		default:
			return errClosed
		}
	}
}

type writeReq struct {
	ctx context.Context
	fn  func(tx *sql.Tx) (int64, error)
	// savepoint isolates fn from the rest of the batch. Without it, fn must
	// either write nothing and return a task sentinel error (ErrConflict,
	// ErrNotFound, ErrInvalid: the batch goes on), or fail with any other
	// error, which rolls the whole batch back.
	savepoint bool
	// onCommit runs after the commit, before watchers are woken.
	onCommit func()
	done     chan error
}

// clean reports whether a fn error left nothing written.
func clean(err error) bool {
	return errors.Is(err, task.ErrConflict) || errors.Is(err, task.ErrNotFound) || errors.Is(err, task.ErrInvalid)
}

const maxBatch = 128

// writer owns the write connection: it runs queued writes in batches until
// the store closes, then fails what is still queued.
func (s *Store) writer() {
	defer s.bg.Done()
	batch := make([]*writeReq, 0, maxBatch)
	for {
		select {
		case req := <-s.writeQ:
			batch = append(batch[:0], req)
		case <-s.done:
			for {
				select {
				case req := <-s.writeQ:
					req.done <- errClosed
				default:
					return
				}
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case req := <-s.writeQ:
				batch = append(batch, req)
			default:
				break fill
			}
		}
		s.commit(batch)
	}
}

// commit runs one batch in one transaction and answers every caller.
func (s *Store) commit(batch []*writeReq) {
	errs := make([]error, len(batch))
	answer := func(err error) {
		for i, r := range batch {
			if err != nil && errs[i] == nil {
				errs[i] = err
			}
			r.done <- errs[i]
		}
	}
	unlock, err := s.lockWrites()
	if err != nil {
		answer(err)
		return
	}
	defer unlock()
	tx, err := s.wdb.BeginTx(context.Background(), nil)
	if err != nil {
		answer(mapErr(err))
		return
	}
	var latest int64
	abort := func(i int, err error) {
		tx.Rollback()
		errs[i] = err
		answer(fmt.Errorf("batched write failed: %w", err))
	}
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		if r.savepoint {
			if _, err := tx.Exec("SAVEPOINT w"); err != nil {
				abort(i, mapErr(err))
				return
			}
		}
		change, err := r.fn(tx)
		switch {
		case err == nil:
			latest = max(latest, change)
		case r.savepoint:
			errs[i] = err
			if _, err := tx.Exec("ROLLBACK TO w"); err != nil {
				abort(i, mapErr(err))
				return
			}
		case clean(err):
			errs[i] = err
		default:
			abort(i, err)
			return
		}
		if r.savepoint {
			if _, err := tx.Exec("RELEASE w"); err != nil {
				abort(i, mapErr(err))
				return
			}
		}
	}
	hwm := s.markHWM(tx)
	if err := tx.Commit(); err != nil {
		answer(mapErr(err))
		return
	}
	s.clock.hwmAt = max(s.clock.hwmAt, hwm)
	for i, r := range batch {
		if errs[i] == nil && r.onCommit != nil {
			r.onCommit()
		}
	}
	if latest > 0 {
		s.broadcast(latest)
	}
	answer(nil)
}

// appendChange records a write of key in the changes table, pruning the
// oldest rows now and then, and returns the change's seq.
func (s *Store) appendChange(ctx context.Context, tx *sql.Tx, key string) (int64, error) {
	var seq int64
	if err := tx.StmtContext(ctx, s.insChange).QueryRowContext(ctx, key).Scan(&seq); err != nil {
		return 0, mapErr(err)
	}
	if s.writes.Add(1)%s.pruneEvery == 0 {
		if _, err := tx.StmtContext(ctx, s.pruneChanges).ExecContext(ctx, seq-int64(s.cfg.Retention)); err != nil {
			return 0, mapErr(err)
		}
	}
	return seq, nil
}

// Insert stores t unless its key exists; see task.Store.
func (s *Store) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	if err := task.ValidateName("key", t.Key); err != nil {
		return nil, false, err
	}
	if err := task.ValidatePayload(t.Payload); err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	pin, err := pinned(t)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	doc, err := json.Marshal(t)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	var stored *task.Task
	var inserted bool
	var change int64
	err = s.submit(&writeReq{ctx: ctx, onCommit: func() {
		if inserted {
			s.remember(change, t)
		}
	}, fn: func(tx *sql.Tx) (int64, error) {
		var seq int64
		err := tx.StmtContext(ctx, s.insTask).QueryRowContext(ctx,
			t.Key, t.Kind, string(t.State), nanos(t.NextClaimAt), t.Priority, pin, string(doc)).Scan(&seq)
		if errors.Is(err, sql.ErrNoRows) {
			stored, err = scanTask(tx.StmtContext(ctx, s.selTaskW).QueryRowContext(ctx, t.Key))
			return 0, mapErr(err)
		}
		if err != nil {
			return 0, mapErr(err)
		}
		inserted = true
		stored = t
		t.ID, t.Seq, t.Version = strconv.FormatInt(seq, 10), seq, 1
		change, err = s.appendChange(ctx, tx, t.Key)
		return change, err
	}})
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	return stored, inserted, nil
}

// Get returns the task with key or task.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (*task.Task, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	t, err := scanTask(s.selTask.QueryRowContext(ctx, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("get %s: %w", key, task.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, mapErr(err))
	}
	return t, nil
}

// Update writes t if the stored version is t.Version; see task.Store.
func (s *Store) Update(ctx context.Context, t *task.Task) error {
	if err := task.ValidatePayload(t.Payload); err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	pin, err := pinned(t)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	next := t.Version + 1
	// The doc carries the new version so that readers of the doc alone agree.
	c := *t
	c.Version = next
	doc, err := json.Marshal(&c)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	var change int64
	err = s.submit(&writeReq{ctx: ctx, onCommit: func() { s.remember(change, &c) }, fn: func(tx *sql.Tx) (int64, error) {
		res, err := tx.StmtContext(ctx, s.updTask).ExecContext(ctx,
			t.Kind, string(t.State), nanos(t.NextClaimAt), t.Priority, pin, string(doc), t.Key, t.Version)
		if err != nil {
			return 0, mapErr(err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return 0, mapErr(err)
		} else if n == 0 {
			var one int
			err := tx.StmtContext(ctx, s.existsW).QueryRowContext(ctx, t.Key).Scan(&one)
			if errors.Is(err, sql.ErrNoRows) {
				return 0, task.ErrNotFound
			}
			if err != nil {
				return 0, mapErr(err)
			}
			return 0, fmt.Errorf("version %d: %w", t.Version, task.ErrConflict)
		}
		change, err = s.appendChange(ctx, tx, t.Key)
		return change, err
	}})
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	t.Version = next
	return nil
}

var unfinished = `state IN ('` + string(task.StatePending) + `', '` + string(task.StateRunning) + `')`

// Candidates returns one page of unfinished tasks; see task.CandidateQuery.
func (s *Store) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("%w: candidates: limit must be positive", task.ErrInvalid)
	}
	var b strings.Builder
	args := make([]any, 0, 8)
	b.WriteString("SELECT seq, version, doc FROM tasks WHERE " + unfinished)
	now := q.Now.UnixNano()
	if q.Ready {
		b.WriteString(" AND next_claim_at <= ?")
	} else {
		b.WriteString(" AND next_claim_at > ?")
	}
	args = append(args, now)
	if len(q.Kinds) > 0 {
		b.WriteString(" AND kind IN (?" + strings.Repeat(", ?", len(q.Kinds)-1) + ")")
		for _, k := range q.Kinds {
			args = append(args, k)
		}
	}
	if q.WorkerID != "" {
		b.WriteString(" AND (pinned = '' OR EXISTS (SELECT 1 FROM json_each(pinned) WHERE value = ?))")
		args = append(args, q.WorkerID)
	}
	if a := q.After; a != nil {
		if q.Ready {
			b.WriteString(" AND (priority < ? OR (priority = ? AND seq > ?))")
			args = append(args, a.Priority, a.Priority, a.Seq)
		} else {
			n := nanos(a.NextClaimAt)
			b.WriteString(" AND (next_claim_at > ? OR (next_claim_at = ? AND seq > ?))")
			args = append(args, n, n, a.Seq)
		}
	}
	if q.Ready {
		b.WriteString(" ORDER BY priority DESC, seq ASC")
	} else {
		b.WriteString(" ORDER BY next_claim_at ASC, seq ASC")
	}
	b.WriteString(" LIMIT ?")
	args = append(args, q.Limit)
	ts, err := s.query(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("candidates: %w", err)
	}
	return ts, nil
}

// List returns tasks in publish order; see task.ListQuery.
func (s *Store) List(ctx context.Context, q task.ListQuery) ([]*task.Task, error) {
	var b strings.Builder
	args := []any{q.AfterSeq}
	b.WriteString("SELECT seq, version, doc FROM tasks WHERE seq > ?")
	if q.State != "" {
		b.WriteString(" AND state = ?")
		args = append(args, string(q.State))
	}
	if q.Kind != "" {
		b.WriteString(" AND kind = ?")
		args = append(args, q.Kind)
	}
	b.WriteString(" ORDER BY seq LIMIT ?")
	limit := q.Limit
	if limit <= 0 {
		limit = -1
	}
	args = append(args, limit)
	ts, err := s.query(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return ts, nil
}

func (s *Store) query(ctx context.Context, q string, args ...any) ([]*task.Task, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, mapErr(err)
	}
	defer rows.Close()
	var out []*task.Task
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, mapErr(err)
		}
		out = append(out, t)
	}
	return out, mapErr(rows.Err())
}

// AcquireLocks takes every key for p.Holder or none; see task.Store.
func (s *Store) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if len(p.Keys) == 0 {
		return nil
	}
	now, until := p.Now.UnixNano(), p.Until.UnixNano()
	err := s.writeAtomic(ctx, func(tx *sql.Tx) (int64, error) {
		sel, up := tx.StmtContext(ctx, s.selLock), tx.StmtContext(ctx, s.upsertLock)
		for _, k := range p.Keys {
			var h task.Holder
			var u int64
			err := sel.QueryRowContext(ctx, k).Scan(&h.TaskKey, &h.WorkerID, &h.Attempt, &h.Instance, &u)
			switch {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return 0, mapErr(err)
			case h != p.Holder && u > now:
				return 0, &task.LockedError{Key: k, Holder: h, Until: time.Unix(0, u).UTC()}
			}
			if _, err := up.ExecContext(ctx, k, p.Holder.TaskKey, p.Holder.WorkerID, p.Holder.Attempt, p.Holder.Instance, until); err != nil {
				return 0, mapErr(err)
			}
		}
		return 0, nil
	})
	if err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	return nil
}

// ReleaseLocks frees the keys still held by p.Holder.
func (s *Store) ReleaseLocks(ctx context.Context, p task.LockParams) error {
	if len(p.Keys) == 0 {
		return nil
	}
	err := s.writeAtomic(ctx, func(tx *sql.Tx) (int64, error) {
		del := tx.StmtContext(ctx, s.delLock)
		for _, k := range p.Keys {
			if _, err := del.ExecContext(ctx, k, p.Holder.TaskKey, p.Holder.WorkerID, p.Holder.Attempt, p.Holder.Instance); err != nil {
				return 0, mapErr(err)
			}
		}
		return 0, nil
	})
	if err != nil {
		return fmt.Errorf("release locks for %s: %w", p.Holder.TaskKey, err)
	}
	return nil
}

// broadcast records that changes up to seq exist (0: no news, just wake)
// and wakes every waiting stream of this Store.
func (s *Store) broadcast(seq int64) {
	s.mu.Lock()
	if seq > s.latest {
		s.latest = seq
	}
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

// waitChan returns the channel the next broadcast closes.
func (s *Store) waitChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wake
}

// startTail starts the goroutine that notices changes committed by other
// processes: on file notifications for the database and its WAL, and every
// PollInterval, it reads the highest change seq and wakes the streams when
// it grew. It only queries while streams are open.
func (s *Store) startTail() error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("no file notifications; polling only", slog.Any("err", err))
		fw = nil
	} else if err := fw.Add(filepath.Dir(s.path)); err != nil {
		s.log.Warn("no file notifications; polling only", slog.Any("err", err))
		fw.Close()
		fw = nil
	}
	base := filepath.Base(s.path)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		var events <-chan fsnotify.Event
		var errs <-chan error
		if fw != nil {
			defer fw.Close()
			events, errs = fw.Events, fw.Errors
		}
		tick := time.NewTicker(s.cfg.PollInterval)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			case ev, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				name := filepath.Base(ev.Name)
				if name != base && name != base+"-wal" {
					continue
				}
				// A busy writer produces a burst of events: one read
				// covers all those already queued.
				for drained := false; !drained; {
					select {
					case _, ok := <-events:
						if !ok {
							events, drained = nil, true
						}
					default:
						drained = true
					}
				}
			case err, ok := <-errs:
				if !ok {
					errs = nil
					continue
				}
				s.log.Warn("file notifications", slog.Any("err", err))
				continue
			}
			if s.watchers.Load() == 0 {
				continue
			}
			var max int64
			if err := s.maxChange.QueryRowContext(context.Background()).Scan(&max); err != nil {
				if !s.closed.Load() {
					s.log.Warn("tail changes", slog.Any("err", err))
				}
				continue
			}
			s.mu.Lock()
			grew := max > s.latest
			s.mu.Unlock()
			if grew {
				s.broadcast(max)
			}
		}
	}()
	return nil
}

// Watch opens a change stream of task writes; see task.Store. The stream
// ends when ctx is done, Close is called on it, or the Store is closed.
func (s *Store) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	var pos int64
	if p.ResumeAfter != nil {
		n, err := strconv.ParseInt(string(p.ResumeAfter), 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: watch: resume token %q", task.ErrInvalid, p.ResumeAfter)
		}
		pos = n
		if err := s.checkHistory(ctx, pos); err != nil {
			return nil, fmt.Errorf("watch: %w", err)
		}
	} else if err := s.maxChange.QueryRowContext(ctx).Scan(&pos); err != nil {
		return nil, fmt.Errorf("watch: %w", mapErr(err))
	}
	st := &stream{s: s, pos: pos, done: make(chan struct{})}
	s.watchers.Add(1)
	st.stop = context.AfterFunc(ctx, func() { st.close() })
	return st, nil
}

// checkHistory fails with task.ErrHistoryLost when changes after pos have
// been pruned.
func (s *Store) checkHistory(ctx context.Context, pos int64) error {
	var oldest int64
	if err := s.minChange.QueryRowContext(ctx).Scan(&oldest); err != nil {
		return mapErr(err)
	}
	if oldest > pos+1 {
		return fmt.Errorf("resume after change %d, oldest kept is %d: %w", pos, oldest, task.ErrHistoryLost)
	}
	return nil
}

// batch is how many change rows one query reads.
const batch = 256

type stream struct {
	s    *Store
	stop func() bool

	mu   sync.Mutex // serialises Next
	pos  int64      // guarded by tokMu for ResumeToken
	tokM sync.Mutex
	buf  []task.Event

	once sync.Once
	done chan struct{}
}

func (st *stream) close() {
	st.once.Do(func() {
		close(st.done)
		st.s.watchers.Add(-1)
	})
}

// Close ends the stream; Next then fails.
func (st *stream) Close() error {
	st.stop()
	st.close()
	return nil
}

func (st *stream) ResumeToken() task.Token {
	st.tokM.Lock()
	defer st.tokM.Unlock()
	return task.Token(strconv.AppendInt(nil, st.pos, 10))
}

var errStreamClosed = fmt.Errorf("sqlitestore: change stream: %w", task.ErrClosed)

// Next returns the next task write; see task.ChangeStream.
func (st *stream) Next(ctx context.Context) (task.Event, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		select {
		case <-st.done:
			return task.Event{}, errStreamClosed
		default:
		}
		if st.s.closed.Load() {
			return task.Event{}, errClosed
		}
		if err := ctx.Err(); err != nil {
			return task.Event{}, err
		}
		if len(st.buf) > 0 {
			ev := st.buf[0]
			st.buf = st.buf[1:]
			seq, _ := strconv.ParseInt(string(ev.Token), 10, 64)
			st.tokM.Lock()
			st.pos = seq
			st.tokM.Unlock()
			return ev, nil
		}
		// Take the wake channel before reading so that a commit between
		// the read and the wait is not missed.
		wake := st.s.waitChan()
		if err := st.fill(ctx); err != nil {
			return task.Event{}, err
		}
		if len(st.buf) > 0 {
			continue
		}
		select {
		case <-wake:
		case <-st.done:
		case <-ctx.Done():
		}
	}
}

// fill reads the next batch of changes after pos into buf.
func (st *stream) fill(ctx context.Context) error {
	s := st.s
	rows, err := s.selChanges.QueryContext(ctx, st.pos, batch)
	if err != nil {
		return fmt.Errorf("change stream: %w", mapErr(err))
	}
	defer rows.Close()
	want := st.pos + 1
	for rows.Next() {
		var seq int64
		var key string
		var tseq, version sql.NullInt64
		var doc sql.NullString
		if err := rows.Scan(&seq, &key, &tseq, &version, &doc); err != nil {
			return fmt.Errorf("change stream: %w", mapErr(err))
		}
		if seq != want && len(st.buf) == 0 {
			// A gap right after pos: pruned while we were behind?
			if err := s.checkHistory(ctx, st.pos); err != nil {
				return fmt.Errorf("change stream: %w", err)
			}
		}
		ev := task.Event{Key: key, Token: task.Token(strconv.AppendInt(nil, seq, 10))}
		if t := s.recalled(seq); t != nil {
			ev.Task = t
		} else if doc.Valid {
			t, err := decode(tseq.Int64, version.Int64, doc.String)
			if err != nil {
				return fmt.Errorf("change stream: %w", err)
			}
			ev.Task = t
		}
		st.buf = append(st.buf, ev)
		want = seq + 1
	}
	return mapErr(rows.Err())
}

// PutRecord stores r unless a later one is there; see task.RecordStore.
func (s *Store) PutRecord(ctx context.Context, r task.Record) error {
	if err := task.ValidateName("record kind", r.Kind); err != nil {
		return err
	}
	if err := task.ValidateName("record id", r.ID); err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) (int64, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO records (kind, id, at, value) VALUES (?, ?, ?, ?)
			ON CONFLICT (kind, id) DO UPDATE SET at = excluded.at, value = excluded.value WHERE excluded.at >= records.at`,
			r.Kind, r.ID, nanos(r.At), string(r.Value))
		return 0, mapErr(err)
	})
}

// Records returns every record of kind; see task.RecordStore.
func (s *Store) Records(ctx context.Context, kind string) ([]task.Record, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, at, value FROM records WHERE kind = ? ORDER BY id`, kind)
	if err != nil {
		return nil, fmt.Errorf("records %s: %w", kind, mapErr(err))
	}
	defer rows.Close()
	var out []task.Record
	for rows.Next() {
		r := task.Record{Kind: kind}
		var at int64
		var value string
		if err := rows.Scan(&r.ID, &at, &value); err != nil {
			return nil, fmt.Errorf("records %s: %w", kind, mapErr(err))
		}
		r.At, r.Value = time.Unix(0, at).UTC(), json.RawMessage(value)
		out = append(out, r)
	}
	return out, mapErr(rows.Err())
}

const recentSize = 4096

// remember keeps a copy of the document written as change seq.
func (s *Store) remember(seq int64, t *task.Task) {
	if seq == 0 {
		return
	}
	doc := t.Clone()
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	if s.recent == nil {
		s.recent = make(map[int64]*task.Task, recentSize)
	}
	delete(s.recent, s.ring[s.ringPos])
	s.ring[s.ringPos] = seq
	s.ringPos = (s.ringPos + 1) % recentSize
	s.recent[seq] = doc
}

// recalled returns the document this Store wrote as change seq, if kept.
func (s *Store) recalled(seq int64) *task.Task {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	return s.recent[seq]
}
