package sqlitestore

// The store clock.
//
// Leases are compared across the processes that share a database file, so
// they need one clock that no process's wall clock can bend: a wall clock
// stepped (NTP, VM resume, a mis-set Config.Clock) 30 s ahead would take
// every live lease at once, one 30 s behind would wait 30 s for every new
// task. Every process on one host shares the kernel's CLOCK_BOOTTIME
// (monotonic, counts suspend, never stepped), so the database keeps a clock
// epoch in a one-row table `clock`: the boot id
// (/proc/sys/kernel/random/boot_id), the store time at the epoch and the
// boot time at the epoch. Then
//
//	Store.Now = epoch_store + (boottime_now − epoch_boot)
//
// in every process of the host, whatever its wall clock says, and it never
// goes backwards or jumps with the wall clock.
//
// The first opener after a reboot (another boot id), or of a file without
// an epoch, writes a new epoch at max(local clock, high-water mark +
// hwmEvery). The high-water mark (column hwm) is the greatest store time
// written: each commit raises it when it is hwmEvery old, so no stored
// "now" lies beyond hwm + hwmEvery and store time never goes backwards
// across reboots either.
//
// Config.Clock is the local wall clock: it only seeds a new epoch, and when
// it disagrees with the store clock by more than a tenth of
// task.DefaultWorkerTimeout, one warning is logged (and one info line when
// they agree again).
//
// Fallback, when the epoch can be neither used nor written (no
// CLOCK_BOOTTIME outside Linux, a read-only database without a current
// epoch, a boot clock behind the stored epoch as in a time namespace): the
// store runs a private epoch at max(local clock, stored hwm) driven by this
// process's monotonic clock. It still never goes backwards nor follows
// wall-clock steps, but processes agree only as well as their wall clocks
// did when they opened; a warning says so, with the reason.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/task"
)

const (
	// skewLimit is how far the local clock may be from the store clock
	// before a warning: a tenth of the default lease.
	skewLimit = task.DefaultWorkerTimeout / 10
	// skewCheckEvery spaces the local clock comparisons.
	skewCheckEvery = time.Second
	// hwmEvery is how stale the stored high-water mark may get.
	hwmEvery = 100 * time.Millisecond
)

// hostClock reads the host's shared monotonic clock; a test hook
// (Config.host) replaces it.
type hostClock struct {
	// bootID names the current boot of the host.
	bootID func() (string, error)
	// boottime is the time since boot, suspend included.
	boottime func() (time.Duration, error)
}

const clockSchema = `CREATE TABLE IF NOT EXISTS clock (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	boot_id TEXT NOT NULL,
	epoch_store INTEGER NOT NULL,
	epoch_boot INTEGER NOT NULL,
	hwm INTEGER NOT NULL
)`

// storeClock is a Store's clock state, fixed by initClock except for the
// atomics.
type storeClock struct {
	local  func() time.Time
	mono   func() (time.Duration, error) // host boot time, or process monotonic time
	shared bool                          // the epoch in the database is in use
	// Store time is epochStore + (mono() − epochMono), in nanoseconds.
	epochStore, epochMono int64

	last      atomic.Int64 // greatest time returned, for the clamp
	nextCheck atomic.Int64 // store time of the next skew check
	skewed    atomic.Bool  // a disagreement was logged and not yet resolved
	log       *slog.Logger

	// Writer goroutine only.
	hwmStmt  *sql.Stmt // raises hwm; nil without the clock table
	hwmAt    int64     // last hwm written by this Store
	hwmErred bool
}

// Now returns the store clock's time; see the comment at the top of this
// file.
func (s *Store) Now() time.Time { return time.Unix(0, s.clock.now()) }

func (c *storeClock) now() int64 {
	if c.mono == nil { // not initialised: Open failed half way
		return c.local().UnixNano()
	}
	m, err := c.mono()
	if err != nil {
		// The boot clock went away (it cannot on Linux): hold the last
		// time rather than follow a wall clock.
		return c.last.Load()
	}
	now := c.epochStore + int64(m) - c.epochMono
	// Clamp: a shared epoch never goes backwards, but make that a property
	// of this code and not of the kernel.
	for {
		last := c.last.Load()
		if now <= last {
			now = last
			break
		}
		if c.last.CompareAndSwap(last, now) {
			break
		}
	}
	if next := c.nextCheck.Load(); now >= next && c.nextCheck.CompareAndSwap(next, now+int64(skewCheckEvery)) {
		c.checkSkew(now)
	}
	return now
}

// checkSkew compares the local clock with the store clock now and logs
// when they start or stop disagreeing.
func (c *storeClock) checkSkew(now int64) {
	local := c.local().UnixNano()
	off := time.Duration(local - now)
	switch {
	case off.Abs() > skewLimit && c.skewed.CompareAndSwap(false, true):
		c.log.Warn("local clock disagrees with the store clock; leases follow the store clock",
			slog.Duration("local_minus_store", off), slog.Duration("limit", skewLimit),
			slog.Time("store_time", time.Unix(0, now).UTC()), slog.Bool("shared_epoch", c.shared))
	case off.Abs() <= skewLimit/2 && c.skewed.CompareAndSwap(true, false):
		c.log.Info("local clock agrees with the store clock again", slog.Duration("local_minus_store", off))
	}
}

// epochRow is the clock table's one row.
type epochRow struct {
	bootID           string
	store, boot, hwm int64
}

func scanEpoch(r *sql.Row) (epochRow, bool, error) {
	var e epochRow
	err := r.Scan(&e.bootID, &e.store, &e.boot, &e.hwm)
	if errors.Is(err, sql.ErrNoRows) {
		return e, false, nil
	}
	return e, err == nil, err
}

const selEpoch = `SELECT boot_id, epoch_store, epoch_boot, hwm FROM clock WHERE id = 1`

// initClock sets up s.clock (see the top of this file). It does not fail:
// what cannot be shared falls back to a private epoch, with a warning.
func (s *Store) initClock(ctx context.Context) {
	c := &s.clock
	c.local, c.log = s.cfg.Clock, s.log
	host := s.cfg.host
	if host == nil {
		host = &defaultHost
	}
	err := s.sharedEpoch(ctx, host)
	if err == nil {
		s.prepareHWM(ctx)
		c.checkSkew(c.now())
		return
	}
	// Private epoch: at or above every time stored, when readable.
	var hwm int64
	if e, ok, rerr := scanEpoch(s.rdb.QueryRowContext(ctx, selEpoch)); rerr == nil && ok {
		hwm = e.hwm + int64(hwmEvery)
	}
	start := time.Now()
	c.mono = func() (time.Duration, error) { return time.Since(start), nil }
	c.epochStore, c.epochMono, c.shared = max(c.local().UnixNano(), hwm), 0, false
	s.prepareHWM(ctx)
	level := slog.LevelWarn
	if s.wdb == nil {
		level = slog.LevelDebug // a read-only look writes nothing, so its clock matters little
	}
	s.log.Log(ctx, level, "store clock: no shared epoch, using a private one; processes agree only as well as their wall clocks did at open",
		slog.Any("reason", err), slog.Time("store_time", time.Unix(0, c.epochStore).UTC()))
	c.checkSkew(c.now())
}

// sharedEpoch uses the stored epoch of this boot, writing a new one when
// there is none.
func (s *Store) sharedEpoch(ctx context.Context, host *hostClock) error {
	id, err := host.bootID()
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	if _, err := host.boottime(); err != nil {
		return fmt.Errorf("boot clock: %w", err)
	}
	use := func(e epochRow) error {
		b, err := host.boottime()
		if err != nil {
			return fmt.Errorf("boot clock: %w", err)
		}
		if int64(b) < e.boot {
			return fmt.Errorf("boot clock (%s) is behind the stored epoch of this boot (%s)", b, time.Duration(e.boot))
		}
		c := &s.clock
		c.mono, c.epochStore, c.epochMono, c.shared = host.boottime, e.store, e.boot, true
		return nil
	}
	// Most opens find the epoch current: read it without the write lock.
	if e, ok, err := scanEpoch(s.rdb.QueryRowContext(ctx, selEpoch)); err == nil && ok && e.bootID == id {
		return use(e)
	}
	if s.wdb == nil {
		return errors.New("read-only store without an epoch for this boot")
	}
	unlock, err := s.lockWrites()
	if err != nil {
		return err
	}
	defer unlock()
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write clock epoch: %w", mapErr(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, clockSchema); err != nil {
		return fmt.Errorf("write clock epoch: %w", mapErr(err))
	}
	old, ok, err := scanEpoch(tx.QueryRowContext(ctx, selEpoch))
	if err != nil {
		return fmt.Errorf("read clock epoch: %w", mapErr(err))
	}
	if ok && old.bootID == id { // another process won
		return use(old)
	}
	b, err := host.boottime()
	if err != nil {
		return fmt.Errorf("boot clock: %w", err)
	}
	local := s.cfg.Clock().UnixNano()
	e := epochRow{bootID: id, boot: int64(b), store: local}
	if ok {
		e.store = max(local, old.hwm+int64(hwmEvery))
	}
	e.hwm = e.store
	if _, err := tx.ExecContext(ctx, `INSERT INTO clock (id, boot_id, epoch_store, epoch_boot, hwm) VALUES (1, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET boot_id = excluded.boot_id, epoch_store = excluded.epoch_store,
		epoch_boot = excluded.epoch_boot, hwm = excluded.hwm`, e.bootID, e.store, e.boot, e.hwm); err != nil {
		return fmt.Errorf("write clock epoch: %w", mapErr(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("write clock epoch: %w", mapErr(err))
	}
	attrs := []any{slog.String("boot_id", id), slog.Time("store_time", time.Unix(0, e.store).UTC()),
		slog.Duration("store_minus_local", time.Duration(e.store-local))}
	if ok {
		attrs = append(attrs, slog.String("previous_boot_id", old.bootID), slog.Time("high_water_mark", time.Unix(0, old.hwm).UTC()))
	}
	s.log.Info("store clock: new epoch", attrs...)
	return use(e)
}

// prepareHWM prepares the high-water mark update when the clock table
// exists and the store can write.
func (s *Store) prepareHWM(ctx context.Context) {
	if s.wdb == nil {
		return
	}
	st, err := s.wdb.PrepareContext(ctx, `UPDATE clock SET hwm = max(hwm, ?) WHERE id = 1`)
	if err != nil {
		return // no clock table (a read-only file): nothing to raise
	}
	s.clock.hwmStmt = st
}

// markHWM raises the stored high-water mark within a write transaction
// when the last one this Store committed (hwmAt, set by the caller after
// the commit) is hwmEvery old, and returns the mark written (0: none).
// Called by the writer goroutine only.
func (s *Store) markHWM(tx *sql.Tx) int64 {
	c := &s.clock
	if c.hwmStmt == nil {
		return 0
	}
	now := c.now()
	if now-c.hwmAt < int64(hwmEvery) {
		return 0
	}
	if _, err := tx.Stmt(c.hwmStmt).Exec(now); err != nil {
		if !c.hwmErred {
			c.hwmErred = true
			s.log.Warn("store clock: cannot raise the high-water mark", slog.Any("err", mapErr(err)))
		}
		return 0
	}
	return now
}
