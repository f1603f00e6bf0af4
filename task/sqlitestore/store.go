// store.go opens and closes a Store: its Config, the file checks, the
// read-write and read-only opens, and the cross-process write lock.

// Package sqlitestore is leasepool's embedded backend: a task.Store kept in
// one SQLite file (modernc.org/sqlite, WAL mode) for a single box without
// MongoDB. Several processes may open the same file. Every task write also
// appends a row to a changes table in the same transaction; watchers in the
// same process are woken at once after each commit, and watchers in other
// processes tail that table by sequence number, woken by file notifications
// on the store's -lock file (each commit that wrote changes signals there)
// and by a polling fallback.
package sqlitestore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasepool/leasepool/task"
)

var _ task.Store = (*Store)(nil)

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
	// FrozenWriterKill is how long a process may stay stopped (SIGSTOP,
	// a shell's Ctrl-Z) while it holds the store's write lock before a
	// process waiting for the lock SIGKILLs it: nothing can be written to
	// the file while it is stopped, so every lease on the store would
	// lapse. Default DefaultFrozenWriterKill; negative never kills (writers
	// wait until the holder resumes). Linux only.
	FrozenWriterKill time.Duration
	// Synchronous is how long a commit waits for the disk. Default
	// SyncFull: a write that returned survives power loss and an OS crash.
	// SyncNormal trades that for speed.
	Synchronous Synchronous

	host             *hostClock // test hook: the host's boot clock; nil is the real one
	walRestartFrames int        // test hook: restartFrames; 0 is the default
}

func (c *Config) validate() error {
	if c.PollInterval < 0 {
		return fmt.Errorf("%w: sqlitestore config: PollInterval (%s) must not be negative", task.ErrInvalid, c.PollInterval)
	}
	if c.Retention < 0 {
		return fmt.Errorf("%w: sqlitestore config: Retention (%d) must not be negative", task.ErrInvalid, c.Retention)
	}
	if _, ok := syncPragmas[c.Synchronous]; !ok {
		return fmt.Errorf("%w: sqlitestore config: Synchronous (%q) must be %q or %q", task.ErrInvalid, c.Synchronous, SyncFull, SyncNormal)
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
	if out.FrozenWriterKill == 0 {
		out.FrozenWriterKill = DefaultFrozenWriterKill
	}
	if out.Synchronous == "" {
		out.Synchronous = SyncFull
	}
	return out
}

// Store is a task.Store on one SQLite file. It is safe for concurrent use.
type Store struct {
	path string
	cfg  Config
	log  *slog.Logger

	wdb *sql.DB // one connection: every write transaction
	// seen is the task versions lately written or read (counts.go).
	seen seenVersions
	// readVersion is the schema version the read statements were made for:
	// a read-only open reads older files as they are.
	readVersion int
	// writeLock is flock(2)ed around every write transaction. SQLite's own
	// busy handler sleeps and polls (up to 100 ms a nap), so under
	// contention from other processes a writer can starve for seconds and
	// miss its lease; a blocking flock hands the lock over at once.
	writeLock *os.File
	wmu       sync.Mutex // holds writeLock within this process
	writeQ    chan *writeReq
	bulkQ     chan *writeReq // the bulk lane (writeBulk)
	rdb       *sql.DB        // several read-only connections

	// Prepared statements on wdb.
	insTask, selTaskW, updTask, updHot, existsW, insChange, insDocChange, pruneChanges, selStored, upsertCount, userVersion *sql.Stmt
	selLock, upsertLock, delLock                                                                                            *sql.Stmt
	selAhead, upsertPlace, delPlace, pruneLine                                                                              *sql.Stmt
	selDocTerms, insTerms, delTerms                                                                                         *sql.Stmt
	// txStmts are the writer's statements bound to its current
	// transaction (see txStmt).
	txStmts map[*sql.Stmt]*sql.Stmt
	// guarding and refused are the authorizer's state (guard.go), used
	// on the writer goroutine alone.
	guarding bool
	refused  string
	// writerGoroutine is the writer goroutine's id, and inTx is set while
	// it runs an InTx function: a write submitted from there would wait
	// for the writer forever (tx.go).
	writerGoroutine atomic.Uint64
	inTx            atomic.Bool
	// Prepared statements on rdb.
	selTask, selChanges, maxChange, minChange *sql.Stmt

	writes     atomic.Int64 // task writes by this Store, for pruning
	pruneEvery int64
	pruned     atomic.Int64 // changes up to this seq were pruned by this Store
	commits    atomic.Int64 // write transactions committed, for the checkpointer
	cdb        *sql.DB      // the checkpointer's connection
	// committed, lockWait and lockHeld are WriteStats' counts.
	committed, lockWait, lockHeld atomic.Int64
	// mainLag is the most commits a main-lane write waited for, its own
	// included (noteMainLag).
	mainLag atomic.Int64
	// txBegin, txStatements and txCommit split the write transactions'
	// time under the lock (WriteStats).
	txBegin, txStatements, txCommit atomic.Int64

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
		txStmts:    map[*sql.Stmt]*sql.Stmt{},
		pruneEvery: int64(min(1000, max(1, c.Retention/10))),
	}
	if !c.ReadOnly {
		registerWritable(s, true) // from its first write: see PauseAllWrites
	}
	if err := s.openFiles(ctx); err != nil {
		registerWritable(s, false)
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	s.initClock(ctx)
	if !c.ReadOnly {
		s.writeQ = make(chan *writeReq, maxBatch)
		s.bulkQ = make(chan *writeReq, maxBatch)
		s.bg.Add(1)
		go s.writer()
		if err := s.startCheckpointer(); err != nil {
			close(s.done)
			s.bg.Wait()
			s.closeDBs()
			registerWritable(s, false)
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
	}
	if err := s.startTail(); err != nil {
		close(s.done)
		s.bg.Wait()
		s.closeDBs()
		registerWritable(s, false)
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

// openFiles opens the databases, read-only or read-write as configured,
// and closes what it opened when it fails.
func (s *Store) openFiles(ctx context.Context) error {
	if s.cfg.ReadOnly {
		if err := s.openReadOnly(ctx); err != nil {
			s.closeDBs()
			return mapErr(err)
		}
		return nil
	}
	_, statErr := os.Stat(s.path + "-lock")
	if err := s.open(ctx); err != nil {
		s.closeDBs()
		if errors.Is(statErr, os.ErrNotExist) {
			os.Remove(s.path + "-lock") // leave a refused file's directory as it was
		}
		return mapErr(err)
	}
	return nil
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
	q += s.syncPragma()
	if s.rdb, err = openDB("file:"+filepath.ToSlash(s.path)+q, readConns); err != nil {
		return err
	}
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
	return s.prepareRead(ctx, v)
}

// readConns is the size of the read pool.
const readConns = 8

// openDB opens a pool of at most conns connections, kept open for the
// Store's life since each one holds its prepared statements.
func openDB(dsn string, conns int) (*sql.DB, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	return db, nil
}

// dsn is the DSN of the store's read-write (readOnly false) or read pool
// connections. Every connection gets the synchronous setting, readers
// too: the last connection to close checkpoints the WAL, with its own.
func (s *Store) dsn(readOnly bool) string {
	q := "?_pragma=busy_timeout(10000)&_pragma=foreign_keys(0)&_txlock=immediate"
	if readOnly {
		q = "?_pragma=busy_timeout(10000)&_pragma=query_only(1)"
	} else {
		q += "&_pragma=journal_mode(WAL)"
	}
	return "file:" + filepath.ToSlash(s.path) + q + s.syncPragma()
}

func (s *Store) open(ctx context.Context) error {
	var err error
	if s.writeLock, err = os.OpenFile(s.path+"-lock", os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		return err
	}
	// The writer never checkpoints: see startCheckpointer.
	if s.wdb, err = s.openGuardedDB(s.dsn(false) + "&_pragma=wal_autocheckpoint(0)"); err != nil {
		return err
	}
	// The first connection switches a new database to WAL, which takes an
	// exclusive lock SQLite's busy handler does not wait for: processes
	// opening one new store at once would get SQLITE_BUSY. They take turns
	// under the write lock instead.
	unlock, err := s.lockWrites()
	if err != nil {
		return err
	}
	err = s.wdb.PingContext(ctx)
	unlock()
	if err != nil {
		return err
	}
	if err := s.migrate(ctx); err != nil {
		return err
	}
	if s.rdb, err = openDB(s.dsn(true), readConns); err != nil {
		return err
	}
	return s.prepare(ctx)
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
	registerWritable(s, false)
	return s.closeDBs()
}

// lockWrites takes the cross-process write lock (see Store.writeLock),
// counting the time spent waiting for it and holding it (WriteStats).
func (s *Store) lockWrites() (unlock func(), err error) {
	from := time.Now()
	s.wmu.Lock()
	fd := int(s.writeLock.Fd())
	err = syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		err = s.waitWriteLock(fd)
	}
	if err != nil {
		s.wmu.Unlock()
		return nil, fmt.Errorf("lock %s: %w", s.writeLock.Name(), err)
	}
	held := time.Now()
	s.lockWait.Add(int64(held.Sub(from)))
	return func() {
		// Timed before letting go: the waiter it wakes may run first.
		s.lockHeld.Add(int64(time.Since(held)))
		syscall.Flock(int(s.writeLock.Fd()), syscall.LOCK_UN)
		s.wmu.Unlock()
	}, nil
}

func (s *Store) closeDBs() error {
	var errs []error
	if s.writeLock != nil {
		errs = append(errs, s.writeLock.Close())
	}
	for _, db := range []*sql.DB{s.rdb, s.cdb, s.wdb} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	return errors.Join(errs...)
}
