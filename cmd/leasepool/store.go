package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/redact"
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
	warnSecretFlag(c, "store", "LEASEPOOL_STORE", true)
	return openStoreURL(c, c.String("store"), opts)
}

// warnSecretFlag logs a warning when flag, holding a secret (isURL: a URL
// holding a password), was given on the command line rather than in its
// environment variable env: every user of the machine sees a command line
// (ps, /proc/PID/cmdline).
func warnSecretFlag(c *cli.Context, flag, env string, isURL bool) {
	v := c.String(flag)
	if v == "" || !c.IsSet(flag) || os.Getenv(env) == v {
		return // not given, or given in the environment
	}
	if isURL && redact.URL(v) == v {
		return // a URL with no password
	}
	slog.Warn(fmt.Sprintf("--%s holds a secret that every user of this machine can read in ps; give it in %s instead", flag, env))
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

// storeAction is the action of a command on one thing its arguments name:
// it reads the name with arg, opens the store (which must exist), runs op
// on it and prints what op returns with show.
func storeAction[T any](arg func(*cli.Context) (string, error), op func(*cli.Context, task.Store, string) (T, error),
	show func(io.Writer, T)) cli.ActionFunc {
	return func(c *cli.Context) error {
		name, err := arg(c)
		if err != nil {
			return err
		}
		s, err := openStore(c, true)
		if err != nil {
			return err
		}
		defer s.Close()
		v, err := op(c, s, name)
		if err != nil {
			return err
		}
		show(c.App.Writer, v)
		return nil
	}
}
