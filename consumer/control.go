package consumer

// The controls: the stored pauses and rate limits (package control), loaded
// when the change stream opens, whenever the control doorbell rings, and
// with every safety-net or poll query; and the rate limits' slot locks,
// taken at each start.

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasepool/leasepool/control"
)

// loadControl reloads the pauses and limits and tells the scheduler. On a
// failed read it keeps the controls it had.
func (c *Consumer) loadControl(ctx context.Context) {
	st, err := control.Load(ctx, c.store)
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("load pauses and limits; keeping the last ones", slog.Any("err", err))
		}
		return
	}
	if old := c.ctl.Swap(st); !sameControls(old, st) {
		c.logger.Info("controls", slog.Int("pauses", len(st.Pauses)), slog.Int("limits", len(st.Limits)))
	}
	signal(c.controlChanged)
}

func sameControls(a, b *control.State) bool {
	if a == nil || b == nil {
		return a == b
	}
	if len(a.Pauses) != len(b.Pauses) || len(a.Limits) != len(b.Limits) {
		return false
	}
	for i := range a.Pauses {
		if a.Pauses[i].Target != b.Pauses[i].Target {
			return false
		}
	}
	for i := range a.Limits {
		if a.Limits[i] != b.Limits[i] {
			return false
		}
	}
	return true
}

// errPaused is a claim refused because a pause covers the task (loaded
// after the task was dispatched).
var errPaused = errors.New("paused")

// rateLimited is a claim refused because every slot of a limit is taken
// until until (store time).
type rateLimited struct {
	bucket string
	until  time.Time
}

func (r *rateLimited) Error() string {
	return "rate limit " + r.bucket + " reached until " + r.until.Format(time.RFC3339Nano)
}

// slotTable is what this process last saw of each slot lock: when it
// frees. It spares store trips for slots known taken; one found free
// here but taken in the store is learnt from the lock error.
type slotTable struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// free returns b's slots not known taken at now, from a random one on, so
// that workers do not all try slot 0 first.
func (s *slotTable) free(b control.Bucket, now time.Time) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	start := rand.IntN(b.N)
	for j := range b.N {
		i := (start + j) % b.N
		if !s.until[b.SlotKey(i)].After(now) {
			out = append(out, i)
		}
	}
	return out
}

// full reports whether every slot of b is known taken at now, and then
// when the first frees.
func (s *slotTable) full(b control.Bucket, now time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var at time.Time
	for i := range b.N {
		u := s.until[b.SlotKey(i)]
		if !u.After(now) {
			return time.Time{}, false
		}
		if at.IsZero() || u.Before(at) {
			at = u
		}
	}
	return at, true
}

// earliest is when the first of b's slots frees, as known here.
func (s *slotTable) earliest(b control.Bucket, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var at time.Time
	for i := range b.N {
		if u := s.until[b.SlotKey(i)]; at.IsZero() || u.Before(at) {
			at = u
		}
	}
	return latest(at, now)
}

// note records that slot frees at until; past entries are dropped when
// the table grows, so it stays bounded by the limits in use.
func (s *slotTable) note(slot string, until, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[string]time.Time{}
	}
	if len(s.until) >= 4096 {
		for k, u := range s.until {
			if !u.After(now) {
				delete(s.until, k)
			}
		}
	}
	s.until[slot] = until
}

// forget drops what is known of slots this process took and gave back.
func (s *slotTable) forget(slots []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range slots {
		delete(s.until, k)
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
