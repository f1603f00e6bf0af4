// sync.go is the store's durability setting: SQLite's synchronous pragma.

package sqlitestore

// Synchronous is how long a commit waits for the disk: SQLite's
// synchronous setting (https://www.sqlite.org/pragma.html#pragma_synchronous),
// given to every connection the store opens.
type Synchronous string

const (
	// SyncFull, the default, syncs the WAL in every commit, before the
	// writes it carries return: a returned publish, claim or finish
	// survives power loss and an OS crash. A group commit is one
	// transaction, so one sync serves every write batched in it.
	SyncFull Synchronous = "full"
	// SyncNormal syncs the WAL only at checkpoints. A returned write
	// survives a crash of the process, but after power loss or an OS
	// crash the last commits may be rolled back (SQLite documents this
	// of WAL mode at NORMAL): a published task can vanish, a finished one
	// run again. The file itself is not corrupted.
	SyncNormal Synchronous = "normal"
)

// syncPragmas maps each accepted setting to SQLite's name for it; ""
// (Config's zero value) is the default.
var syncPragmas = map[Synchronous]string{"": "FULL", SyncFull: "FULL", SyncNormal: "NORMAL"}

// syncPragma is the DSN parameter setting the store's synchronous mode.
func (s *Store) syncPragma() string {
	return "&_pragma=synchronous(" + syncPragmas[s.cfg.Synchronous] + ")"
}
