package sqlitestore

import "time"

// WriteStats counts a Store's write transactions and its use of the
// file's write lock, which one process at a time holds. They tell whether
// the lock is what limits a host: summed over every process on the file,
// LockHeld grows by at most the time passed, and once it grows at nearly
// that rate every write of every process waits for it, so another
// process on the file adds no throughput.
type WriteStats struct {
	// Commits is the write transactions committed.
	Commits int64
	// Writes is the write requests those transactions carried: the
	// group commit's batch size is Writes / Commits.
	Writes int64
	// LockWait is the time spent waiting for the write lock, by writes
	// and by this Store's checkpoints and upgrades.
	LockWait time.Duration
	// LockHeld is the time the lock was held by this Store, from taking
	// it to letting it go.
	LockHeld time.Duration
}

// WriteStats returns the counts since the Store was opened. It is safe
// to call at any time, concurrently with writes.
func (s *Store) WriteStats() WriteStats {
	return WriteStats{
		Commits:  s.commits.Load(),
		Writes:   s.committed.Load(),
		LockWait: time.Duration(s.lockWait.Load()),
		LockHeld: time.Duration(s.lockHeld.Load()),
	}
}
