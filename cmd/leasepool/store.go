package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// openStore opens the --store URL. mustExist refuses to create a missing
// embedded store file, for commands that only read or change tasks.
func openStore(c *cli.Context, mustExist bool) (task.Store, error) {
	return openStoreURL(c.Context, c.String("store"), mustExist)
}

// openStoreReadOnly opens the --store URL for a command that only reads: an
// embedded store file must exist, is opened read-only (nothing written, not
// even the schema or the journal mode) and must be a leasepool store.
func openStoreReadOnly(c *cli.Context) (task.Store, error) {
	return openStoreMode(c.Context, c.String("store"), true, true)
}

func openStoreURL(ctx context.Context, url string, mustExist bool) (task.Store, error) {
	return openStoreMode(ctx, url, mustExist, false)
}

func openStoreMode(ctx context.Context, url string, mustExist, readOnly bool) (task.Store, error) {
	switch {
	case strings.HasPrefix(url, "sqlite:"):
		path := strings.TrimPrefix(url, "sqlite:")
		if path == "" {
			return nil, fmt.Errorf("--store: %q names no file (want sqlite:PATH)", url)
		}
		if mustExist {
			if _, err := os.Stat(path); err != nil {
				return nil, fmt.Errorf("--store: %w", err)
			}
		}
		s, err := sqlitestore.Open(ctx, path, &sqlitestore.Config{Logger: slog.Default(), ReadOnly: readOnly})
		if err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		return s, nil
	case strings.HasPrefix(url, "mongodb://"), strings.HasPrefix(url, "mongodb+srv://"):
		return openMongo(ctx, url)
	}
	return nil, fmt.Errorf("--store: unknown scheme in %q (want sqlite:PATH or mongodb://HOST/DB)", url)
}
