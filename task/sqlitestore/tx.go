// tx.go runs the user's own SQL and leasepool's task writes in one
// transaction (InTx): a row and the task that carries it out commit
// together or not at all, and a handler's business write commits with its
// task's success or not at all.

package sqlitestore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"

	"github.com/leasepool/leasepool/task"
)

// ErrWriteInTx fails a write of the Store itself (Insert, Update,
// task.Publish on the Store, ...) made from inside an InTx function: the
// writer runs that function, so the write would wait for it forever. Use
// the Tx's methods instead.
var ErrWriteInTx = errors.New("sqlitestore: a write of the store from inside its InTx function would wait for itself; use the Tx")

// Tx is the transaction an InTx function runs in: the user's SQL on their
// own tables (Exec, Query, QueryRow) and leasepool's task writes
// (Publish, Succeed), all committed together when the function returns
// nil. It is valid only until the function returns, and on its goroutine.
type Tx struct {
	s   *Store
	ctx context.Context
	tx  *sql.Tx
	req *writeReq

	mu     sync.Mutex
	rows   []*sql.Rows // closed when the function returns: open ones would hold the commit
	failed error       // a task write that failed: the transaction rolls back
	ended  bool
	latest int64 // the highest change seq the task writes appended
	// committed run once the transaction committed.
	committed []func()
}

// Attempt is a running attempt of a task that a handler finishes in its
// own transaction (Tx.Succeed); *consumer.Job is one. Succeeded is told
// the document stored, after the commit, so that the worker writes no
// outcome of its own for the attempt.
type Attempt interface {
	Holder() task.Holder
	Output() task.Output
	Succeeded(doc *task.Task)
}

// InTx runs fn in a write transaction of the store's file, and commits
// what it wrote, the user's rows and leasepool's tasks together, when fn
// returns nil; when fn returns an error, a task write of the Tx failed, or
// fn panics, nothing it wrote is kept. InTx returns fn's error (or the
// failed task write's) as is.
//
// fn runs on the store's writer goroutine, within the group commit that
// carries every other write of the process (inside a savepoint of its
// own) and under the file's cross-process write lock: the change stream,
// the tasks' versions and counts stay as every other write keeps them,
// and no other write of the file, by any process, runs until fn returns.
// Keep fn short: no network calls, no waiting. Inside fn use only the Tx:
// a write of the Store itself fails with ErrWriteInTx. fn's SQL may not
// name leasepool's tables (Reserved), control the transaction or change
// the connection's settings (PRAGMA); such a statement fails wrapping
// task.ErrInvalid. A panic in fn is raised again in InTx's caller.
//
// As with any write, an error that is not fn's own (the store closed, the
// disk full, ctx ended while waiting for the writer) leaves the outcome
// unknown: look before doing it again, or make fn idempotent (the tasks it
// publishes are, by key).
func (s *Store) InTx(ctx context.Context, fn func(tx *Tx) error) error {
	if fn == nil {
		return fmt.Errorf("%w: InTx: fn is nil", task.ErrInvalid)
	}
	var panicked any
	var stack []byte
	tx := &Tx{s: s}
	req := &writeReq{ctx: ctx, savepoint: true, onCommit: func() {
		for _, f := range tx.committed {
			f()
		}
	}}
	tx.req = req
	req.fn = func(ctx context.Context, sqlTx *sql.Tx) (int64, error) {
		tx.ctx, tx.tx = ctx, sqlTx
		s.inTx.Store(true)
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					panicked, stack = r, debug.Stack()
					err = fmt.Errorf("sqlitestore: InTx function panicked: %v", r)
				}
			}()
			return fn(tx)
		}()
		s.inTx.Store(false)
		change, terr := tx.end()
		return change, cmpOr(terr, err)
	}
	err := s.submit(req)
	if panicked != nil {
		panic(fmt.Sprintf("%v\n\n(in sqlitestore.InTx) %s", panicked, stack))
	}
	return err
}

func cmpOr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// end closes what fn left open and returns the highest change the Tx's
// task writes appended, and the error of a task write that failed.
func (tx *Tx) end() (int64, error) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.ended = true
	var err error
	for _, r := range tx.rows {
		if cerr := r.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	tx.rows = nil
	if tx.failed != nil {
		return 0, tx.failed
	}
	return tx.latest, err
}

// Context is the context of InTx's caller, uncancellable: a statement
// interrupted inside the writer's transaction could roll back other
// callers' writes batched with it.
func (tx *Tx) Context() context.Context { return tx.ctx }

// check refuses a call after the function returned.
func (tx *Tx) check() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.ended {
		return errors.New("sqlitestore: Tx used after its InTx function returned")
	}
	return nil
}

// Exec runs one or more statements of the user's SQL in the transaction.
func (tx *Tx) Exec(query string, args ...any) (sql.Result, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	var res sql.Result
	err := tx.s.guarded(query, func() (err error) {
		res, err = tx.tx.ExecContext(tx.ctx, query, args...)
		return err
	})
	return res, err
}

// Query runs a query of the user's SQL in the transaction; it sees what
// the transaction wrote so far. Rows still open when the function returns
// are closed then.
func (tx *Tx) Query(query string, args ...any) (*sql.Rows, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	var rows *sql.Rows
	err := tx.s.guarded(query, func() (err error) {
		rows, err = tx.tx.QueryContext(tx.ctx, query, args...)
		return err
	})
	if err != nil {
		return nil, err
	}
	tx.mu.Lock()
	tx.rows = append(tx.rows, rows)
	tx.mu.Unlock()
	return rows, nil
}

// QueryRow runs a query expected to return at most one row; its error, if
// any, is reported by Scan.
func (tx *Tx) QueryRow(query string, args ...any) *Row {
	rows, err := tx.Query(query, args...)
	return &Row{rows: rows, err: err}
}

// Row is QueryRow's result.
type Row struct {
	rows *sql.Rows
	err  error
}

// Scan copies the row's columns into dest, as sql.Row.Scan does: with no
// row it returns sql.ErrNoRows.
func (r *Row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	return r.rows.Close()
}

// Publish publishes a task in the transaction, as task.Publish does
// (validated alike: bad input is refused naming the field): it is stored,
// and workers hear of it, only if the transaction commits. A Publish that
// fails makes the whole transaction roll back, whatever the function
// returns.
func (tx *Tx) Publish(p task.PublishParams) (*task.Task, task.PublishResult, error) {
	if err := tx.check(); err != nil {
		return nil, "", err
	}
	t, res, err := task.Publish(tx.ctx, txStore{tx.s, tx}, p)
	if err != nil {
		return nil, "", tx.fail(err)
	}
	return t, res, nil
}

// Succeed records a's attempt as successful in the transaction, with what
// its handler recorded (a.Output()), so that the handler's own writes
// commit with its task's success or not at all. It is refused with an
// error wrapping task.ErrLeaseLost when a no longer holds a live lease
// (taken over, cancelled, expired), and then the whole transaction rolls
// back. Once it committed a is told (a.Succeeded), and the worker writes
// no outcome of its own for the attempt.
func (tx *Tx) Succeed(a Attempt) (*task.Task, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	h := a.Holder()
	out := a.Output()
	now := tx.s.Now()
	doc, err := task.Modify(tx.ctx, txStore{tx.s, tx}, h.TaskKey, func(t *task.Task) error {
		t.Record(h, out)
		return t.Succeed(h, now)
	})
	if errors.Is(err, task.ErrNotFound) {
		err = fmt.Errorf("task %s deleted: %w", h.TaskKey, task.ErrLeaseLost)
	}
	if err != nil {
		return nil, tx.fail(err)
	}
	kept := doc.Clone()
	tx.onCommit(func() { a.Succeeded(kept) })
	return doc, nil
}

// fail dooms the transaction with err, the first task write's failure.
func (tx *Tx) fail(err error) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.failed == nil {
		tx.failed = err
	}
	return err
}

func (tx *Tx) onCommit(f func()) {
	tx.mu.Lock()
	tx.committed = append(tx.committed, f)
	tx.mu.Unlock()
}

// noteChange records the change seq a task write of the Tx appended.
func (tx *Tx) noteChange(seq int64) {
	tx.mu.Lock()
	tx.latest = max(tx.latest, seq)
	tx.mu.Unlock()
}

// txStore is the Store as task.Publish and task.Modify see it inside a
// Tx: its reads and writes of tasks run in the Tx's transaction, on the
// writer goroutine, and are noted for the Store only once it committed.
// Its other methods are the Store's (a write among them fails with
// ErrWriteInTx); task.Publish and task.Modify call none.
type txStore struct {
	*Store
	tx *Tx
}

func (ts txStore) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	op, err := ts.newInsert(ctx, t)
	if err != nil {
		return nil, false, err
	}
	change, err := op.run(ctx, ts.tx.tx, ts.tx.req)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	ts.tx.noteChange(change)
	ts.tx.onCommit(op.committed)
	return op.stored, op.inserted, nil
}

func (ts txStore) Get(ctx context.Context, key string) (*task.Task, error) {
	t, err := scanTask(ts.tx.tx.StmtContext(ctx, ts.selTaskW).QueryRowContext(ctx, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("get %s: %w", key, task.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, mapErr(err))
	}
	return t, nil
}

func (ts txStore) Update(ctx context.Context, t *task.Task) error {
	op, err := ts.newUpdate(t)
	if err != nil {
		return err
	}
	change, err := op.run(ctx, ts.tx.tx, ts.tx.req)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	ts.tx.noteChange(change)
	ts.tx.onCommit(op.committed)
	t.Version = op.next
	return nil
}

// goroutineID is the calling goroutine's id, read from its stack's
// header ("goroutine 7 [running]:"). It is read only to tell the writer
// goroutine from others while an InTx function runs (see submit).
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b, _ = bytes.CutPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}
