package task

// Quiet reports whether the write that stored t cannot make t claimable
// sooner for any worker but its holders, so that a worker keeping claim
// times need not hear it (WatchParams.SkipQuiet): it made no lifecycle
// change (a log line aside), it was not the insert, and after it every
// worker slot of t is leased. Lease renewals are such writes. A worker
// that missed one holds an older lease end, earlier than the real one; it
// reads the task again before it takes that lease over, so a quiet write
// it did not hear costs it one read, never a wrong claim.
func (t *Task) Quiet() bool {
	if t.Version <= 1 || t.State.Finished() {
		return false
	}
	if t.ChangesVersion == t.Version {
		for _, c := range t.Changes {
			if c.Op != ChangeLogged {
				return false
			}
		}
	}
	return t.CountWorkers(t.UpdatedAt).Live >= t.ConcurrentWorkerCnt
}
