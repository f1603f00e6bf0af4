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
	db, err := openDB(dsn(s.path, false), 1)
	if err != nil {
		return err
	}
	s.cdb = db
	s.bg.Add(1)
	go s.checkpointer()
	return nil
}

func (s *Store) checkpointer() {
	defer s.bg.Done()
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
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
			if _, err := s.cdb.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)"); err != nil && !s.closed.Load() {
				s.log.Debug("checkpoint", slog.Any("err", err))
			}
		}
	}
}
