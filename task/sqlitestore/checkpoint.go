// checkpoint.go moves WAL checkpoints off the write path.

package sqlitestore

import (
	"context"
	"log/slog"
	"time"
)

// checkpointEvery is how often the checkpointer copies committed WAL
// frames back into the database file, when anything was committed.
const checkpointEvery = 100 * time.Millisecond

// startCheckpointer opens the checkpointer's connection and starts it.
// SQLite's automatic checkpoint runs inside the commit that crosses its
// threshold, so every thousandth page or so a commit (and every claim and
// finish batched in it) waited for a thousand pages to be copied and
// synced: the writer connection has it off, and this goroutine runs
// passive checkpoints beside the writes instead.
func (s *Store) startCheckpointer() error {
	db, err := openDB(s.dsn(false), 1)
	if err != nil {
		return err
	}
	s.cdb = db
	s.bg.Add(1)
	go s.checkpointer()
	return nil
}

// restartFrames is how long the WAL may grow before the checkpointer makes
// SQLite start it over. SQLite writes the WAL from its beginning again only
// when a write finds every frame checkpointed; under a steady load a
// passive pass never gets there (commits land while it copies), so the WAL
// would grow without end, each frame an extending write whose writeback
// competes with the workload. 10,000 frames of 4 KiB are about 40 MB.
const restartFrames = 10000

func (s *Store) checkpointer() {
	defer s.bg.Done()
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	limit := s.cfg.walRestartFrames
	if limit == 0 {
		limit = restartFrames
	}
	var seen int64
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		if n := s.commits.Load(); n != seen {
			seen = n
			// Passive: never waits for readers or writers; frames a reader
			// still needs are copied on a later pass.
			frames, err := s.checkpoint()
			if err == nil && frames > limit {
				err = s.checkpointLocked()
			}
			if err != nil && !s.closed.Load() {
				s.log.Debug("checkpoint", slog.Any("err", err))
			}
		}
	}
}

// checkpoint runs one passive checkpoint and returns the WAL's length in
// frames.
func (s *Store) checkpoint() (frames int, err error) {
	var busy, done int
	err = s.cdb.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &done)
	return frames, err
}

// checkpointLocked runs a passive checkpoint holding the write lock, so
// that no commit lands during it: it copies what the unlocked pass left
// (the frames committed meanwhile) and completes, and the next write
// restarts the WAL. It holds the lock for a few milliseconds (the copy and
// two fsyncs), once per restartFrames of WAL.
func (s *Store) checkpointLocked() error {
	unlock, err := s.lockWrites()
	if err != nil {
		return err
	}
	defer unlock()
	_, err = s.checkpoint()
	return err
}
