package sqlitestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(holderEnv); mode != "" {
		holdWriteLock(mode, os.Getenv(holderPathEnv))
		return
	}
	goleak.VerifyTestMain(m)
}

// testLogger logs through t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// open opens path and closes it when t ends.
func open(t testing.TB, path string, cfg *sqlitestore.Config) *sqlitestore.Store {
	t.Helper()
	if cfg == nil {
		cfg = &sqlitestore.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := sqlitestore.Open(context.Background(), path, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Opened {
		path := filepath.Join(t.TempDir(), "leasepool.db")
		return storetest.Opened{
			Store:  open(t, path, nil),
			Reopen: func(t *testing.T) task.Store { return open(t, path, nil) },
		}
	})
}

func TestRefusesNonDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"text":      []byte("hello, this is not a database at all\n"),
		"short":     []byte("SQLite"),
		"corrupted": append([]byte("SQLite format 3\x00"), bytes.Repeat([]byte{0xff}, 4096)...),
	} {
		path := filepath.Join(dir, name+".db")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := sqlitestore.Open(context.Background(), path, &sqlitestore.Config{Logger: testLogger(t)})
		if err == nil {
			s.Close()
			t.Fatalf("%s: Open succeeded", name)
		}
		t.Logf("%s: %v", name, err)
		if msg := err.Error(); !strings.Contains(msg, path) || strings.Contains(msg, "\n") {
			t.Errorf("%s: error %q does not name the path on one line", name, msg)
		}
		got, rerr := os.ReadFile(path)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if !bytes.Equal(got, content) {
			t.Errorf("%s: Open modified the file", name)
		}
		for _, suffix := range []string{"-wal", "-shm", "-journal", "-lock"} {
			if _, err := os.Stat(path + suffix); err == nil {
				t.Errorf("%s: Open left %s behind", name, path+suffix)
			}
		}
	}
	// The plain text case reads as the issue asks.
	path := filepath.Join(dir, "text.db")
	_, err := sqlitestore.Open(context.Background(), path, nil)
	if want := fmt.Sprintf("open store %s: file is not a database", path); err == nil || err.Error() != want {
		t.Errorf("error %v; want %q", err, want)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for field, cfg := range map[string]*sqlitestore.Config{
		"PollInterval": {PollInterval: -time.Second},
		"Retention":    {Retention: -1},
	} {
		_, err := sqlitestore.Open(context.Background(), filepath.Join(dir, "x.db"), cfg)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v; want ErrInvalid naming the field", field, err)
		}
	}
}

func TestReopenKeepsData(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasepool.db")
	s := open(t, path, nil)
	ctx := t.Context()
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "a", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, task.ErrClosed) {
		t.Errorf("Get after Close: %v; want ErrClosed", err)
	}
	s2 := open(t, path, nil)
	if got, err := s2.Get(ctx, "a"); err != nil || got.Version != 1 {
		t.Fatalf("Get after reopen: %v %v", got, err)
	}
}

func TestHistoryLost(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "leasepool.db"), &sqlitestore.Config{Retention: 10})
	ctx := t.Context()
	cs, err := s.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "first", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Next(ctx); err != nil {
		t.Fatal(err)
	}
	tok := cs.ResumeToken()
	for i := range 50 {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprint("k", i), Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Watch(ctx, task.WatchParams{ResumeAfter: tok}); !errors.Is(err, task.ErrHistoryLost) {
		t.Fatalf("Watch from a pruned token: %v; want ErrHistoryLost", err)
	}
	// The stream that fell behind learns it too.
	if _, err := cs.Next(ctx); !errors.Is(err, task.ErrHistoryLost) {
		t.Fatalf("Next on a stream behind the pruned history: %v; want ErrHistoryLost", err)
	}
	// A recent token still resumes.
	cs2, err := s.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	cs3, err := s.Watch(ctx, task.WatchParams{ResumeAfter: cs2.ResumeToken()})
	if err != nil {
		t.Fatalf("Watch from the latest token: %v", err)
	}
	cs3.Close()
}

func TestCrossHandleLatency(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasepool.db")
	// A long poll interval, so that file notifications do the work.
	a := open(t, path, &sqlitestore.Config{PollInterval: time.Hour})
	b := open(t, path, &sqlitestore.Config{PollInterval: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cs, err := b.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var total time.Duration
	const n = 20
	for i := range n {
		start := time.Now()
		if _, _, err := task.Publish(ctx, a, task.PublishParams{Key: fmt.Sprint("k", i), Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		ev, err := cs.Next(ctx)
		if err != nil {
			t.Fatalf("Next (file notifications only): %v", err)
		}
		if ev.Key != fmt.Sprint("k", i) {
			t.Fatalf("event for %s; want k%d", ev.Key, i)
		}
		total += time.Since(start)
	}
	t.Logf("cross-handle publish-to-event latency, file notifications only: mean %s over %d", total/n, n)

	// Polling alone (no notification would arrive for a remote write in
	// some setups): still seen.
	c := open(t, path, &sqlitestore.Config{PollInterval: 5 * time.Millisecond})
	cs2, err := c.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	start := time.Now()
	if _, _, err := task.Publish(ctx, a, task.PublishParams{Key: "polled", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs2.Next(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("cross-handle latency with 5ms polling: %s", time.Since(start))
}

// A commit by a version before the lock file carried the newest change
// seq writes a zero byte over the signal's marker: the other handles must
// look for the change themselves, not trust the stale seq, or they would
// hear of it only at their next poll.
func TestOlderVersionsCommitWakes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasepool.db")
	a := open(t, path, nil)
	b := open(t, path, &sqlitestore.Config{PollInterval: time.Hour}) // file notifications only
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cs, err := b.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, _, err := task.Publish(ctx, a, task.PublishParams{Key: "new", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if ev, err := cs.Next(ctx); err != nil || ev.Key != "new" {
		t.Fatalf("Next = %v, %v; want the event of new", ev.Key, err)
	}
	// The older version's commit: a change row, then its one-byte signal.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `INSERT INTO changes (key, doc) VALUES ('new', NULL)`); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(path+"-lock", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.WriteAt([]byte{0}, 0); err != nil {
		t.Fatal(err)
	}
	ev, err := cs.Next(ctx)
	if err != nil || ev.Key != "new" || ev.Task == nil {
		t.Fatalf("Next after an older version's commit = %+v, %v; want new's change", ev, err)
	}
}

func TestCloseEndsStreams(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "leasepool.db"), nil)
	cs, err := s.Watch(context.Background(), task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := cs.Next(context.Background())
		done <- err
	}()
	s.Close()
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, task.ErrClosed) {
			t.Fatalf("Next after store Close: %v; want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next kept blocking after the store closed")
	}
	cs.Close()
}

func BenchmarkInsert(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "leasepool.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	now := s.Now()
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		tk, err := task.NewTask(task.PublishParams{Key: fmt.Sprint("k", i), Kind: "k", Payload: []byte(`{"n":1}`)}, now)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.Insert(ctx, tk); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

func BenchmarkUpdate(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "leasepool.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	tk, _, err := task.Publish(ctx, s, task.PublishParams{Key: "a", Kind: "k", Payload: []byte(`{"n":1}`)})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for b.Loop() {
		tk.Priority++
		if err := s.Update(ctx, tk); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

// BenchmarkUpdateParallel updates distinct tasks from many goroutines, as
// a worker pool does.
func BenchmarkUpdateParallel(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "leasepool.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	const n = 64
	for i := range n {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprint("k", i), Kind: "k"}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomicCounter
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprint("k", next.add()%n)
		tk, err := s.Get(ctx, key)
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			tk.Priority++
			if err := s.Update(ctx, tk); errors.Is(err, task.ErrConflict) {
				if tk, err = s.Get(ctx, key); err != nil {
					b.Error(err)
					return
				}
			} else if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) add() int64 { return c.n.Add(1) }

// TestChangeSeqsNeverGoBack prunes all but the newest change after every
// write (Retention 1) and reopens the file: a stream resumed from the last
// token sees the next write, whose seq is past every seq handed out before.
// (The changes table has no AUTOINCREMENT: only the kept newest row stops
// seqs from starting over.)
func TestChangeSeqsNeverGoBack(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasepool.db")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s := open(t, path, &sqlitestore.Config{Retention: 1})
	cs, err := s.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	last := int64(0)
	next := func(cs task.ChangeStream) {
		t.Helper()
		ev, err := cs.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := strconv.ParseInt(string(ev.Token), 10, 64)
		if err != nil || seq <= last {
			t.Fatalf("change token %q after %d: want a greater seq", ev.Token, last)
		}
		last = seq
	}
	for i := range 20 {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprint("k", i), Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		next(cs)
	}
	tok := cs.ResumeToken()
	cs.Close()
	s.Close()
	s2 := open(t, path, &sqlitestore.Config{Retention: 1})
	cs2, err := s2.Watch(ctx, task.WatchParams{ResumeAfter: tok})
	if err != nil {
		t.Fatalf("resume from the newest token after a reopen: %v", err)
	}
	defer cs2.Close()
	if _, _, err := task.Publish(ctx, s2, task.PublishParams{Key: "after", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	next(cs2)
}

// BenchmarkClaimFinish writes what a worker at concurrency 32 writes per
// task, a claim and a finish, from 32 goroutines, over tasks published
// beforehand (not timed): the store's cost per task.
func BenchmarkClaimFinish(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "leasepool.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	const batch, workers = 2000, 32
	n := 0
	for b.Loop() {
		b.StopTimer()
		docs := make(chan *task.Task, batch)
		for range batch {
			tk, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprint("k", n), Kind: "k"})
			if err != nil {
				b.Fatal(err)
			}
			n++
			docs <- tk
		}
		close(docs)
		b.StartTimer()
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for tk := range docs {
					now := s.Now()
					tk.State, tk.NextClaimAt, tk.UpdatedAt = task.StateRunning, now.Add(4*time.Second), now
					if err := s.Update(ctx, tk); err != nil {
						b.Error(err)
						return
					}
					tk.State, tk.NextClaimAt, tk.UpdatedAt = task.StateSucceeded, time.Time{}, s.Now()
					if err := s.Update(ctx, tk); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/task")
}
