package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// openStore opens the --store URL. mustExist refuses to create a missing
// embedded store file, for commands that only read or change tasks.
func openStore(c *cli.Context, mustExist bool) (task.Store, error) {
	return openStoreOptions(c, store.Options{MustExist: mustExist})
}

// openStoreReadOnly opens the --store URL for a command that only reads: an
// embedded store file must exist, is opened read-only (nothing written, not
// even the schema or the journal mode) and must be a leasepool store.
func openStoreReadOnly(c *cli.Context) (task.Store, error) {
	return openStoreOptions(c, store.Options{ReadOnly: true})
}

func openStoreOptions(c *cli.Context, opts store.Options) (task.Store, error) {
	return openStoreURL(c, c.String("store"), opts)
}

// openStoreURL opens url for the command c runs, as if given as --store.
func openStoreURL(c *cli.Context, url string, opts store.Options) (task.Store, error) {
	s, err := store.Open(c.Context, url, opts)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	if strings.HasPrefix(url, "sqlite:") && !opts.ReadOnly {
		embeddedProcs()
	}
	return s, nil
}

var raiseProcs sync.Once

// embeddedProcs gives a process that writes an embedded store two more Ps
// than the Go default (one a core), unless GOMAXPROCS is set. SQLite there
// is Go translated from C: its file syscalls (some forty pwrites a commit)
// keep their P, too short for the runtime to hand it on, so the store's
// writer and checkpointer held back goroutines ready to run while a core
// sat in the kernel. A worker process on 2 cores drained 20,000 noop
// tasks at a median 13,000/s with 4 Ps against 11,000/s with 2 (six runs
// each, alternating); publish-to-start p99 across processes went from
// 0.7-1.0 ms to 1.1-1.4 ms.
func embeddedProcs() {
	raiseProcs.Do(func() {
		procs := runtime.GOMAXPROCS(0)
		if n := embeddedProcsFor(os.Getenv("GOMAXPROCS"), procs); n != procs {
			runtime.GOMAXPROCS(n)
			slog.Debug("embedded store: GOMAXPROCS raised", slog.Int("procs", n))
		}
	})
}

// embeddedProcsFor is embeddedProcs' choice given the GOMAXPROCS
// environment variable and the current setting: a value the user chose
// stands.
func embeddedProcsFor(env string, procs int) int {
	if env != "" {
		return procs
	}
	return procs + 2
}
