package sqlitestore

import (
	"sync/atomic"
	"time"
)

// cachedBoot reads a boot clock (CLOCK_BOOTTIME) as an offset from the
// monotonic clock, which Go reads without a system call: the kernel serves
// CLOCK_BOOTTIME only through one, and the store clock is read several
// times a task, so a system call each would sit on every write's path.
// The boot clock is the monotonic clock plus the time spent suspended, and
// both run at the same (NTP-adjusted) rate, so the offset changes only
// across a suspend. A suspend also moves the wall clock against the
// monotonic clock by its length, so a reading whose wall and monotonic
// advances since the last raw read differ by more than bootDrift reads the
// boot clock again; so does one bootRefresh after it, which bounds
// anything else.
type cachedBoot struct {
	// clocks reads the wall and the monotonic clock (ns; the monotonic
	// one from any fixed origin) at one instant.
	clocks func() (wall, mono int64)
	// raw reads the boot clock with a system call.
	raw  func() (time.Duration, error)
	last atomic.Pointer[bootReading]
}

// bootReading is a raw boot clock reading and the wall and monotonic
// clocks at the same instant.
type bootReading struct{ wall, mono, boot int64 }

const (
	// bootDrift is how far the wall clock may move against the monotonic
	// clock before the boot clock is read again: more than NTP's slew of
	// at most 0.5 ms a second over bootRefresh, far less than any lease.
	bootDrift = time.Millisecond
	// bootRefresh is how long a raw reading serves.
	bootRefresh = time.Second
	// bootPair is the longest a raw reading may take to count as one
	// instant with the clocks read around it; a reading taken across a
	// preemption is taken again.
	bootPair = 20 * time.Microsecond
)

// read returns the boot clock's time.
func (c *cachedBoot) read() (time.Duration, error) {
	wall, mono := c.clocks()
	if r := c.last.Load(); r != nil {
		dm := mono - r.mono
		if dw := wall - r.wall; dm >= 0 && dm < int64(bootRefresh) && max(dw-dm, dm-dw) < int64(bootDrift) {
			return time.Duration(r.boot + dm), nil
		}
	}
	return c.refresh()
}

// refresh reads the boot clock with a system call, between two readings
// of the other clocks, and keeps the reading when those were close enough
// together to date it.
func (c *cachedBoot) refresh() (time.Duration, error) {
	var boot time.Duration
	for range 3 {
		w1, m1 := c.clocks()
		b, err := c.raw()
		if err != nil {
			return 0, err
		}
		w2, m2 := c.clocks()
		boot = b
		if m2-m1 <= int64(bootPair) {
			// Dated at the middle: off by at most half of bootPair.
			c.last.Store(&bootReading{wall: w1 + (w2-w1)/2, mono: m1 + (m2-m1)/2, boot: int64(b)})
			return b, nil
		}
	}
	return boot, nil // no pair close enough: serve the raw reading, keep none
}

// processStart is the monotonic clock's origin for wallAndMono.
var processStart = time.Now()

// wallAndMono reads both clocks Go keeps, in one time.Now.
func wallAndMono() (wall, mono int64) {
	t := time.Now()
	return t.UnixNano(), int64(t.Sub(processStart))
}
