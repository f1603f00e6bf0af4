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
	// Begin, Statements and Commit are what the write transactions'
	// share of LockHeld went on: starting the transaction (taking the
	// newest snapshot, which after another process's commit drops the
	// connection's page cache, so that the statements read their pages
	// again), running the batched requests' statements, and committing
	// (appending the changed pages to the WAL). Begin growing faster than
	// Commits, or Statements faster than Writes, with more processes on
	// the file is the cost of sharing it.
	Begin, Statements, Commit time.Duration
}

// WriteStats returns the counts since the Store was opened. It is safe
// to call at any time, concurrently with writes.
func (s *Store) WriteStats() WriteStats {
	return WriteStats{
		Commits:  s.commits.Load(),
		Writes:   s.committed.Load(),
		LockWait: time.Duration(s.lockWait.Load()),
		LockHeld: time.Duration(s.lockHeld.Load()),

		Begin:      time.Duration(s.txBegin.Load()),
		Statements: time.Duration(s.txStatements.Load()),
		Commit:     time.Duration(s.txCommit.Load()),
	}
}
