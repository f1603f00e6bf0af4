package sqlitestore

import (
	"testing"
	"time"
)

// fakeClocks is a host's wall, monotonic and boot clocks that the test
// moves; each raw boot reading advances the monotonic clock by rawTakes.
type fakeClocks struct {
	wall, mono, suspended int64
	rawTakes              int64
	raws                  int
}

func (f *fakeClocks) clocks() (int64, int64) { return f.wall, f.mono }

func (f *fakeClocks) raw() (time.Duration, error) {
	f.raws++
	f.advance(f.rawTakes)
	return time.Duration(f.mono + f.suspended), nil
}

func (f *fakeClocks) advance(d int64) { f.wall += d; f.mono += d }

func (f *fakeClocks) suspend(d int64) { f.wall += d; f.suspended += d }

func (f *fakeClocks) boot() time.Duration { return time.Duration(f.mono + f.suspended) }

func TestCachedBoot(t *testing.T) {
	f := &fakeClocks{wall: 1e18, mono: 5e9, suspended: 7e9, rawTakes: 1000}
	c := &cachedBoot{clocks: f.clocks, raw: f.raw}
	read := func(what string, wantRaws int) {
		t.Helper()
		got, err := c.read()
		if err != nil {
			t.Fatal(err)
		}
		// A raw reading is dated at the middle of the clock readings around
		// it: off by at most half the time it took.
		if d := (f.boot() - got).Abs(); d > time.Duration(f.rawTakes/2) {
			t.Errorf("%s: boot clock %v, want %v ± %dns", what, got, f.boot(), f.rawTakes/2)
		}
		if f.raws != wantRaws {
			t.Errorf("%s: %d raw readings so far, want %d", what, f.raws, wantRaws)
		}
	}
	read("first", 1)
	for range 10 {
		f.advance(int64(50 * time.Millisecond))
		read("running", 1)
	}
	// NTP slewing the wall clock by 0.5 ms a second: still served.
	f.wall += int64(400 * time.Microsecond)
	read("slewed", 1)
	// A suspend moves the boot and wall clocks, not the monotonic one.
	f.suspend(int64(30 * time.Second))
	read("after a suspend", 2)
	f.advance(int64(10 * time.Millisecond))
	read("after a suspend, cached", 2)
	// A short suspend too, beyond bootDrift.
	f.suspend(int64(2 * time.Millisecond))
	read("after a 2 ms suspend", 3)
	// A wall clock stepped back: read again, no harm.
	f.wall -= int64(time.Hour)
	read("after a wall step", 4)
	f.advance(int64(bootRefresh))
	read("after bootRefresh", 5)
	// A raw reading that took too long to date is served, not kept.
	f.rawTakes = int64(time.Millisecond)
	f.advance(int64(bootRefresh))
	read("slow raw reading", 8)
	read("slow raw reading again", 11)
	f.rawTakes = 1000
	read("fast again", 12)
	read("cached again", 12)
}
