package main

import (
	"fmt"
	"strings"

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
