package sqlitestore

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// logBuf keeps log lines for assertions and passes them to t.Log.
type logBuf struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (b *logBuf) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	b.t.Log(line)
	b.mu.Lock()
	b.lines = append(b.lines, line)
	b.mu.Unlock()
	return len(p), nil
}

// count returns how many lines contain s.
func (b *logBuf) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, l := range b.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

func newLog(t testing.TB) (*slog.Logger, *logBuf) {
	b := &logBuf{t: t}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// fakeHost is a host whose boot id and boot time the test sets: boot time
// is the real elapsed time since the fake boot, from a chosen start.
type fakeHost struct {
	mu    sync.Mutex
	id    string
	start time.Time     // real time of the fake boot
	from  time.Duration // boot time at start
	err   error
}

func (h *fakeHost) reboot(id string, uptime time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.id, h.start, h.from = id, time.Now(), uptime
}

func (h *fakeHost) clock() *hostClock {
	return &hostClock{
		bootID: func() (string, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.id, h.err
		},
		boottime: func() (time.Duration, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.from + time.Since(h.start), h.err
		},
	}
}

func openT(t *testing.T, path string, cfg *Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

const skewWarning = "local clock disagrees with the store clock"

// TestNowIgnoresWallClockSteps steps the local clock 30 s back and then
// 30 s ahead mid-run: Store.Now never goes backwards, does not jump, keeps
// running at the real rate, and one warning is logged per disagreement.
func TestNowIgnoresWallClockSteps(t *testing.T) {
	t.Parallel()
	log, logs := newLog(t)
	var step atomic.Int64
	s := openT(t, filepath.Join(t.TempDir(), "steps.db"), &Config{Logger: log, Clock: func() time.Time {
		return time.Now().Add(time.Duration(step.Load()))
	}})
	realStart, storeStart := time.Now(), s.Now()
	prev := storeStart
	sample := func(d time.Duration) {
		t.Helper()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
			now := s.Now()
			if now.Before(prev) {
				t.Fatalf("Now went back by %s (local clock step %s)", prev.Sub(now), time.Duration(step.Load()))
			}
			if now.Sub(prev) > time.Second {
				t.Fatalf("Now jumped ahead by %s (local clock step %s)", now.Sub(prev), time.Duration(step.Load()))
			}
			prev = now
		}
	}
	sample(200 * time.Millisecond)
	step.Store(int64(-30 * time.Second))
	sample(1200 * time.Millisecond) // past one skew check
	if n := logs.count(skewWarning); n != 1 {
		t.Errorf("%d skew warnings after the step back; want 1", n)
	}
	step.Store(0)
	sample(1200 * time.Millisecond)
	if n := logs.count("agrees with the store clock again"); n != 1 {
		t.Errorf("%d all-clear lines after the clock came back; want 1", n)
	}
	step.Store(int64(30 * time.Second))
	sample(1200 * time.Millisecond)
	if n := logs.count(skewWarning); n != 2 {
		t.Errorf("%d skew warnings after the step ahead; want 2 in all", n)
	}
	elapsedReal, elapsedStore := time.Since(realStart), s.Now().Sub(storeStart)
	if d := (elapsedStore - elapsedReal).Abs(); d > 100*time.Millisecond {
		t.Errorf("store clock ran %s while real time ran %s", elapsedStore, elapsedReal)
	}
}

// TestNewEpochAfterReboot reopens a store after a simulated reboot (another
// boot id, boot time back near zero) with a wall clock an hour behind: the
// new epoch starts at or above every time stored before, and every opener of
// that boot shares it.
func TestNewEpochAfterReboot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "reboot.db")
	host := &fakeHost{}
	host.reboot("boot-1", 72*time.Hour)
	log, logs := newLog(t)
	s1, err := Open(ctx, path, &Config{Logger: log, host: host.clock()})
	if err != nil {
		t.Fatal(err)
	}
	var latest time.Time
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		if _, _, err := task.Publish(ctx, s1, task.PublishParams{Key: key, Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		if _, err := task.Cancel(ctx, s1, key); err != nil {
			t.Fatal(err)
		}
		tk, err := s1.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		latest = tk.UpdatedAt
		time.Sleep(30 * time.Millisecond) // spread the writes over several high-water marks: the test is about them
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	host.reboot("boot-2", 5*time.Second)
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	s2 := openT(t, path, &Config{Logger: log, Clock: behind, host: host.clock()})
	if now := s2.Now(); now.Before(latest) {
		t.Fatalf("after the reboot Now is %s, %s before the last stored time %s", now, latest.Sub(now), latest)
	}
	if n := logs.count("store clock: new epoch"); n != 2 {
		t.Errorf("%d new epochs; want 2 (first open, reboot)", n)
	}
	// Another process of the new boot shares the epoch whatever its clock.
	s3 := openT(t, path, &Config{Logger: log, Clock: time.Now, host: host.clock()})
	if d := s3.Now().Sub(s2.Now()).Abs(); d > 50*time.Millisecond {
		t.Errorf("two stores of one boot are %s apart", d)
	}
	if n := logs.count("store clock: new epoch"); n != 2 {
		t.Errorf("%d new epochs; want 2: the third open must reuse the second's", n)
	}
	if !s2.clock.shared || !s3.clock.shared {
		t.Error("a store is not on the shared epoch")
	}
}

// TestPrivateEpochFallback: without a boot clock, or with one behind the
// stored epoch of its boot, a store runs a private epoch, never below the
// high-water mark, and says why.
func TestPrivateEpochFallback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fallback.db")
	host := &fakeHost{}
	host.reboot("boot-1", time.Hour)
	log, logs := newLog(t)
	ahead := func() time.Time { return time.Now().Add(time.Minute) }
	s1 := openT(t, path, &Config{Logger: log, Clock: ahead, host: host.clock()})
	tk, _, err := task.Publish(ctx, s1, task.PublishParams{Key: "a", Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}

	cases := map[string]*fakeHost{
		"no boot clock":  {err: errors.ErrUnsupported},
		"clock behind":   {id: "boot-1", start: time.Now(), from: time.Minute},
		"other boot, ok": nil, // control: the shared epoch
	}
	for name, h := range cases {
		cfg := &Config{Logger: log}
		if h != nil {
			cfg.host = h.clock()
		} else {
			cfg.host = host.clock()
		}
		s := openT(t, path, cfg)
		if now := s.Now(); now.Before(tk.UpdatedAt) {
			t.Errorf("%s: Now %s is before the stored %s", name, now, tk.UpdatedAt)
		}
		if s.clock.shared != (h == nil) {
			t.Errorf("%s: shared epoch %v", name, s.clock.shared)
		}
	}
	if n := logs.count("no shared epoch"); n != 2 {
		t.Errorf("%d fallback warnings; want 2", n)
	}
}
