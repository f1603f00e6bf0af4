// writer.go is the group-commit writer: every write transaction goes
// through one goroutine that batches concurrent callers into one commit.

package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/leasepool/leasepool/task"
)

// write runs fn in a write transaction and, when fn appended change rows,
// wakes the in-process watchers after the commit. Concurrent callers are
// group-committed: the writer goroutine runs up to maxBatch of them in one
// transaction, each inside its own savepoint so that one caller's error
// undoes only its own work. A commit is what costs (a WAL append and the
// cross-process lock), so batching multiplies write throughput without
// changing any caller's all-or-nothing outcome.
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) (change int64, err error)) error {
	return s.submit(&writeReq{ctx: ctx, fn: fn})
}

// writeBulk is write in the bulk lane (documents: device states, the
// inventory, credentials), which the writer serves after the main lane
// (tasks, lease renewals, locks): a flood of document writes waits for
// its turn instead of holding a renewal back past its lease.
func (s *Store) writeBulk(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) (change int64, err error)) error {
	return s.submit(&writeReq{ctx: ctx, fn: fn, bulk: true})
}

// writeAtomic is write for a fn of several statements that must all
// apply or none: it runs inside its own savepoint.
func (s *Store) writeAtomic(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) (change int64, err error)) error {
	return s.submit(&writeReq{ctx: ctx, fn: fn, savepoint: true})
}

func (s *Store) submit(req *writeReq) error {
	if s.closed.Load() {
		return errClosed
	}
	if s.cfg.ReadOnly {
		return ErrReadOnly
	}
	if s.inTx.Load() && goroutineID() == s.writerGoroutine.Load() {
		return ErrWriteInTx
	}
	ctx := req.ctx
	req.done = make(chan error, 1)
	q := s.writeQ
	req.after = s.commits.Load()
	if req.bulk {
		// A full bulk lane blocks here: the back-pressure of a flood of
		// document writes falls on their callers, not on the main lane.
		q = s.bulkQ
	}
	select {
	case q <- req:
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
	// fn runs the request's statements with ctx, which carries the
	// caller's values but is never cancelled (see runOne).
	fn func(ctx context.Context, tx *sql.Tx) (int64, error)
	// savepoint isolates fn from the rest of the batch. Without it, fn must
	// either write nothing and return a task sentinel error (ErrConflict,
	// ErrNotFound, ErrInvalid: the batch goes on), or fail with any other
	// error, which rolls the whole batch back.
	savepoint bool
	// bulk puts the request in the bulk lane (writeBulk).
	bulk bool
	// after is the count of commits before the request was queued.
	after int64
	// onCommit runs after the commit, before watchers are woken.
	onCommit func()
	// counts are the moves in task_counts of fn's writes, applied with
	// the batch when fn succeeded.
	counts []countMove
	done   chan error
}

// clean reports whether a fn error left nothing written.
func clean(err error) bool {
	return errors.Is(err, task.ErrConflict) || errors.Is(err, task.ErrNotFound) || errors.Is(err, task.ErrInvalid)
}

// maxBatch is the most main-lane requests one commit carries; bulkShare
// the bulk-lane requests a commit takes at least, when any wait, so that
// a busy main lane cannot starve the bulk one. A commit carries at most
// maxBatch+bulkShare requests.
const (
	maxBatch  = 128
	bulkShare = 32
)

// writer owns the write connection: it runs queued writes in batches until
// the store closes, then fails what is still queued. Each batch takes
// every main-lane request queued (up to maxBatch) before the bulk lane's,
// so a main-lane request (a lease renewal) waits at most for the commit
// in progress, however many bulk writes are queued behind it.
func (s *Store) writer() {
	defer s.bg.Done()
	s.writerGoroutine.Store(goroutineID())
	batch := make([]*writeReq, 0, maxBatch+bulkShare)
	last := 0
	for {
		select {
		case req := <-s.writeQ:
			batch = append(batch[:0], req)
		case req := <-s.bulkQ:
			batch = append(batch[:0], req)
		case <-s.done:
			for _, q := range []chan *writeReq{s.writeQ, s.bulkQ} {
				for drained := false; !drained; {
					select {
					case req := <-q:
						req.done <- errClosed
					default:
						drained = true
					}
				}
			}
			return
		}
		s.fill(&batch)
		if last >= busyBatch {
			// Busy: let the goroutines about to write (handlers finishing,
			// claims being decided) queue before committing, so each
			// commit carries more writes. Idle, no write waits for this.
			runtime.Gosched()
			s.fill(&batch)
		}
		batch = s.commit(batch)
		last = len(batch)
	}
}

// noteMainLag keeps the most commits a main-lane request waited for,
// its own included: 2 when it came during a commit (that one, then its
// own), more only when the main lane alone held more than one batch.
func (s *Store) noteMainLag(n int64) {
	for {
		cur := s.mainLag.Load()
		if n <= cur || s.mainLag.CompareAndSwap(cur, n) {
			return
		}
	}
}

// busyBatch is the batch size from which the writer yields once before
// committing the next batch.
const busyBatch = 8

// fill adds to batch what is queued: the main lane's first, up to
// maxBatch requests of it, then the bulk lane's, up to maxBatch requests
// in all or bulkShare of the bulk lane, whichever is more.
func (s *Store) fill(batch *[]*writeReq) {
	main, bulk := 0, 0
	for _, r := range *batch {
		if r.bulk {
			bulk++
		} else {
			main++
		}
	}
main:
	for main < maxBatch {
		select {
		case req := <-s.writeQ:
			*batch = append(*batch, req)
			main++
		default:
			break main
		}
	}
	for len(*batch) < maxBatch || bulk < bulkShare {
		select {
		case req := <-s.bulkQ:
			*batch = append(*batch, req)
			bulk++
		default:
			return
		}
	}
}

// commit runs one batch in one transaction and answers every caller; it
// returns the batch as committed. The writes queued while it waited for
// the cross-process write lock join the batch: with several processes on
// one file the lock is often held by another, and a commit (the lock's
// hand-over, a WAL append, every other process's page cache dropped and
// its streams woken) costs about the same for one write as for many.
func (s *Store) commit(batch []*writeReq) []*writeReq {
	var errs []error
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
		errs = make([]error, len(batch))
		answer(err)
		return batch
	}
	defer unlock()
	s.fill(&batch)
	errs = make([]error, len(batch))
	began := time.Now()
	tx, err := s.wdb.BeginTx(context.Background(), nil)
	if err != nil {
		answer(mapErr(err))
		return batch
	}
	// Under the write lock: no newer program's upgrade lands before the
	// commit. One read of the file header, a cached page.
	var v int
	if err := tx.Stmt(s.userVersion).QueryRow().Scan(&v); err != nil || v != schemaVersion {
		tx.Rollback()
		if err == nil {
			err = fmt.Errorf("%w (schema version %d, this program's %d)", ErrSchemaChanged, v, schemaVersion)
		}
		answer(mapErr(err))
		return batch
	}
	clear(s.txStmts) // statements of the last transaction, closed with it
	ran := time.Now()
	s.txBegin.Add(int64(ran.Sub(began)))
	latest, err := runBatch(tx, batch, errs)
	if err == nil {
		err = s.applyCounts(tx, batch, errs)
	}
	if err != nil {
		tx.Rollback()
		answer(fmt.Errorf("batched write failed: %w", err))
		return batch
	}
	hwm := s.markHWM(tx)
	committing := time.Now()
	s.txStatements.Add(int64(committing.Sub(ran)))
	err = tx.Commit()
	s.txCommit.Add(int64(time.Since(committing)))
	if err != nil {
		answer(mapErr(err))
		return batch
	}
	s.clock.hwmAt = max(s.clock.hwmAt, hwm)
	n := s.commits.Add(1)
	s.committed.Add(int64(len(batch)))
	for _, r := range batch {
		if !r.bulk {
			s.noteMainLag(n - r.after)
		}
	}
	for i, r := range batch {
		if errs[i] == nil && r.onCommit != nil {
			r.onCommit()
		}
	}
	// The callers first: a claim's handler need not wait for the signal
	// (a write the kernel turns into a notification for every watcher of
	// the lock file). Streams wait for the broadcast, not for
	// their callers, so none misses the change.
	answer(nil)
	if latest > 0 {
		s.signalCommit(latest)
		s.broadcast(latest)
	}
	return batch
}

// runBatch runs each request of batch in tx, setting errs[i] for each one
// that failed on its own, and returns the highest change seq written. An
// error that dooms the transaction stops it: that request's errs[i] is set
// to it and it is returned, for the caller to roll back and fail the rest.
func runBatch(tx *sql.Tx, batch []*writeReq, errs []error) (latest int64, err error) {
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		change, own, fatal := runOne(tx, r)
		if fatal != nil {
			errs[i] = fatal
			return 0, fatal
		}
		errs[i] = own
		latest = max(latest, change)
	}
	return latest, nil
}

// runOne runs one request in tx, inside a savepoint if it asked for one.
// own is its failure that left nothing written, so the batch goes on;
// fatal is an error after which the transaction cannot be committed.
func runOne(tx *sql.Tx, r *writeReq) (change int64, own, fatal error) {
	if r.savepoint {
		if _, err := tx.Exec("SAVEPOINT w"); err != nil {
			return 0, nil, mapErr(err)
		}
	}
	// Statements run to the end whatever happens to the caller's context:
	// an interrupt inside a write transaction may roll back the whole
	// batch, every other caller's writes with it (and the driver would start
	// a watcher goroutine per statement). The writer checks the context
	// before running fn.
	change, err := r.fn(context.WithoutCancel(r.ctx), tx)
	switch {
	case err == nil:
	case r.savepoint:
		if _, err := tx.Exec("ROLLBACK TO w"); err != nil {
			return 0, nil, mapErr(err)
		}
		change, own = 0, err
	case clean(err):
		return 0, err, nil
	default:
		return 0, nil, err
	}
	if r.savepoint {
		if _, err := tx.Exec("RELEASE w"); err != nil {
			return 0, nil, mapErr(err)
		}
	}
	return change, own, nil
}

// txStmt returns st in the writer's transaction tx, prepared for it once
// per transaction (tx.Stmt builds a new statement on every call; the
// writer runs the same few for every request of a batch). Only fns run by
// the writer may call it.
func (s *Store) txStmt(tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	if t, ok := s.txStmts[st]; ok {
		return t
	}
	t := tx.Stmt(st)
	s.txStmts[st] = t
	return t
}

// appendChange records a write of key, whose document is now doc (without
// its payload), in the changes table, pruning the oldest rows now and then,
// and returns the change's seq.
func (s *Store) appendChange(ctx context.Context, tx *sql.Tx, key, doc string) (int64, error) {
	return s.appendRow(ctx, tx, s.insChange, key, doc)
}

// appendDocChange records a write of document ns/id, whose JSON is now
// doc (nil: deleted), in the changes table.
func (s *Store) appendDocChange(ctx context.Context, tx *sql.Tx, ns, id string, doc *string) (int64, error) {
	return s.appendRow(ctx, tx, s.insDocChange, id, doc, ns)
}

// appendRow inserts a change row with ins, pruning the oldest rows now and
// then, and returns its seq.
func (s *Store) appendRow(ctx context.Context, tx *sql.Tx, ins *sql.Stmt, args ...any) (int64, error) {
	res, err := s.txStmt(tx, ins).ExecContext(ctx, args...)
	if err != nil {
		return 0, mapErr(err)
	}
	seq, err := res.LastInsertId()
	if err != nil {
		return 0, mapErr(err)
	}
	if s.writes.Add(1)%s.pruneEvery == 0 {
		below := seq - int64(s.cfg.Retention)
		if _, err := tx.StmtContext(ctx, s.pruneChanges).ExecContext(ctx, below); err != nil {
			return 0, mapErr(err)
		}
		// Raised before the commit: a stream may then read the table a
		// little early, never serve a pruned change from memory.
		if below > s.pruned.Load() {
			s.pruned.Store(below)
		}
	}
	return seq, nil
}

// signalCommit tells other processes' watchers that changes up to seq
// were committed: it writes the commit signal to the lock file, whose
// inotify event comes after the commit is visible. (The WAL's own events
// come with each frame written, so a watcher woken by them may look before
// the commit lands and then sleep until the next event or poll.) It runs
// under the write lock, so the signals of all processes land in commit
// order and the file holds the newest seq.
func (s *Store) signalCommit(seq int64) {
	s.writeLock.WriteAt(encodeSignal(seq), 0)
}

// The commit signal, at the start of the lock file: a marker byte, padding,
// the newest change seq (big-endian) and its complement, which tells a
// torn read from a seq. Versions before it wrote a zero byte at offset 0
// and nothing else, so a commit of theirs clears the marker: readers then
// query for the newest seq, until a commit of this version signals again.
const (
	signalLen    = 24
	signalMarker = 1
)

func encodeSignal(seq int64) []byte {
	b := make([]byte, signalLen)
	b[0] = signalMarker
	binary.BigEndian.PutUint64(b[8:], uint64(seq))
	binary.BigEndian.PutUint64(b[16:], ^uint64(seq))
	return b
}

// decodeSignal returns the seq in a commit signal; ok is false when b
// holds none (no commit signalled yet, an older version's commit since,
// or a torn read).
func decodeSignal(b []byte) (seq int64, ok bool) {
	if len(b) < signalLen || b[0] != signalMarker {
		return 0, false
	}
	v := binary.BigEndian.Uint64(b[8:])
	return int64(v), v == ^binary.BigEndian.Uint64(b[16:]) && int64(v) >= 0
}
