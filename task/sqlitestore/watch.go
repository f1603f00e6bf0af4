// watch.go is the change stream: in-process wake-ups after each commit,
// the tail that notices other processes' commits (file notifications and
// polling), and the streams that read the changes table.

package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/leasepool/leasepool/task"
)

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
// processes: on file notifications and every PollInterval, it learns the
// highest change seq and wakes the streams when it grew. It only looks
// while streams are open.
func (s *Store) startTail() error {
	fw := s.fileWatcher()
	var signal *os.File
	if fw != nil {
		// The lock file's commit signal names the newest seq: a
		// notification then costs a read of it, not a query. A read-only
		// Store has no writeLock: it opens the file for reading.
		signal = s.writeLock
		if signal == nil {
			signal, _ = os.Open(s.path + "-lock") // none: the tail queries
		}
	}
	s.bg.Add(1)
	go s.tail(fw, signal)
	return nil
}

// fileWatcher watches the -lock file, to which every commit that wrote
// changes writes a byte once it is visible (signalCommit), or, where there
// is none yet (a read-only open of a store no writer opened), the
// database's directory. It returns nil where file notifications are
// unavailable: the tail then polls only. Not the directory when the -lock
// file is there: every WAL frame written and every page checkpointed, by
// any process, this one included, was an event to read and act on, some
// forty per commit.
func (s *Store) fileWatcher() *fsnotify.Watcher {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("no file notifications; polling only", slog.Any("err", err))
		return nil
	}
	target := s.path + "-lock"
	if _, err := os.Stat(target); err != nil {
		target = filepath.Dir(s.path)
	}
	if err := fw.Add(target); err != nil {
		s.log.Warn("no file notifications; polling only", slog.Any("err", err))
		fw.Close()
		return nil
	}
	return fw
}

// tail is the goroutine of startTail; it ends when the store closes.
func (s *Store) tail(fw *fsnotify.Watcher, signal *os.File) {
	defer s.bg.Done()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw != nil {
		defer fw.Close()
		events, errs = fw.Events, fw.Errors
	}
	if signal != nil && signal != s.writeLock {
		defer signal.Close()
	}
	buf := make([]byte, signalLen)
	base := filepath.Base(s.path)
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
			if name != base && name != base+"-wal" && name != base+"-lock" {
				continue
			}
			if !drainEvents(events) {
				events = nil
			}
			if name == base+"-lock" && s.readSignal(signal, buf) {
				continue
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			s.log.Warn("file notifications", slog.Any("err", err))
			continue
		}
		s.pollLatest()
	}
}

// drainEvents discards the events already queued, since a busy writer
// produces a burst of them and one read covers them all. It reports
// whether events is still open.
func drainEvents(events <-chan fsnotify.Event) (open bool) {
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return false
			}
		default:
			return true
		}
	}
}

// readSignal reads the commit signal from the lock file and wakes the
// streams when its seq grew. It reports false when the file holds no
// signal, or no stream is open to want one; the caller then queries.
func (s *Store) readSignal(f *os.File, buf []byte) bool {
	if f == nil || s.watchers.Load() == 0 {
		return false
	}
	n, _ := f.ReadAt(buf, 0)
	seq, ok := decodeSignal(buf[:n])
	if !ok {
		return false
	}
	s.mu.Lock()
	grew := seq > s.latest
	s.mu.Unlock()
	if grew {
		s.broadcast(seq)
	}
	return true
}

// pollLatest reads the highest change seq, while any stream is open, and
// wakes the streams when it grew.
func (s *Store) pollLatest() {
	if s.watchers.Load() == 0 {
		return
	}
	var max int64
	if err := s.maxChange.QueryRowContext(context.Background()).Scan(&max); err != nil {
		if !s.closed.Load() {
			s.log.Warn("tail changes", slog.Any("err", err))
		}
		return
	}
	s.mu.Lock()
	grew := max > s.latest
	s.mu.Unlock()
	if grew {
		s.broadcast(max)
	}
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
	st := &stream{s: s, pos: pos, skipQuiet: p.SkipQuiet, params: p, done: make(chan struct{})}
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
	// skipQuiet leaves out quiet writes (task.WatchParams.SkipQuiet),
	// passing their positions.
	skipQuiet bool
	// params says which namespaces' document writes the stream carries;
	// the others' positions are passed.
	params task.WatchParams

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
			if st.skipQuiet && ev.Task != nil && ev.Task.Quiet() {
				continue
			}
			if ev.Document != nil && !st.params.WantsDocuments(ev.Document.Namespace) ||
				ev.Document == nil && st.params.NoTasks {
				continue
			}
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

// fillRecalled fills buf from the documents this Store wrote, as long as
// the changes right after pos are all its own: a worker that is the only
// writer follows its own writes without reading them back. The first
// change it did not write (another process's) ends the run, and fill
// reads on from the table, so none is skipped and the order holds. A
// stream behind what this Store pruned reads the table too, to be told
// its history is lost, as any other reader would be.
func (st *stream) fillRecalled() bool {
	s := st.s
	if st.pos < s.pruned.Load() {
		return false
	}
	s.mu.Lock()
	latest := s.latest
	s.mu.Unlock()
	for seq := st.pos + 1; seq <= latest && len(st.buf) < batch; seq++ {
		t := s.recalled(seq)
		if t == nil {
			break
		}
		st.buf = append(st.buf, task.Event{Key: t.Key, Task: t, Token: task.Token(strconv.AppendInt(nil, seq, 10))})
	}
	return len(st.buf) > 0
}

// fill reads the next batch of changes after pos into buf.
func (st *stream) fill(ctx context.Context) error {
	if st.fillRecalled() {
		return nil
	}
	s := st.s
	// Caught up: every change is announced by a broadcast raising latest
	// (this Store's commits, and the tail for other processes'), which
	// wakes the stream. Reading the table now would find nothing: a query
	// per commit that a worker following its own writes made for nothing.
	s.mu.Lock()
	caughtUp := st.pos >= s.latest
	s.mu.Unlock()
	if caughtUp {
		return nil
	}
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
		var after, ns, doc, kind, state sql.NullString
		if err := rows.Scan(&seq, &key, &after, &ns, &tseq, &version, &doc, &kind, &state); err != nil {
			return fmt.Errorf("change stream: %w", mapErr(err))
		}
		if tseq.Valid && version.Valid {
			// The row as read: a claim of this version then knows what it
			// moves in task_counts without reading the row again.
			s.seen.noteVersion(tseq.Int64, seenVersion{version.Int64, kind.String, task.State(state.String)})
		}
		if seq != want && len(st.buf) == 0 {
			// A gap right after pos: pruned while we were behind?
			if err := s.checkHistory(ctx, st.pos); err != nil {
				return fmt.Errorf("change stream: %w", err)
			}
		}
		ev := task.Event{Key: key, Token: task.Token(strconv.AppendInt(nil, seq, 10))}
		if ns.Valid {
			ev.Key = ""
			ev.Document, ev.DocumentDeleted = &task.Document{Namespace: ns.String, ID: key}, !after.Valid
			if after.Valid && st.params.WantsDocuments(ns.String) {
				d, err := decodeDocument(after.String)
				if err != nil {
					return fmt.Errorf("change stream: document %s/%s: %w", ns.String, key, err)
				}
				ev.Document = d
			}
		} else if t := s.recalled(seq); t != nil {
			ev.Task = t
		} else if after.Valid {
			t, err := decodeChange(tseq.Int64, after.String, doc)
			if err != nil {
				return fmt.Errorf("change stream: %w", err)
			}
			ev.Task = t
		} else if doc.Valid {
			// A change written before schema version 4: the current document.
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
