// Package store opens a task.Store named by a store URL, the way the
// leasepool CLI's --store flag does, so that a program embedding leasepool
// accepts the same URLs as its command line:
//
//	sqlite:PATH                     an embedded store file (package task/sqlitestore)
//	sqlite:PATH?synchronous=normal  the same, each commit not synced (see below)
//	mongodb://HOST/DB?...           a MongoDB deployment (package task/mongostore)
//	mongodb+srv://HOST/DB?...       the same, with a DNS seed list
//
// An embedded store syncs every commit to disk, so that a write that
// returned survives power loss; synchronous=normal trades that for speed
// (sqlitestore.SyncNormal).
//
// A plain file path is refused rather than guessed at: "x.db" could as well
// be a mistyped URL, and the error says to write sqlite:x.db.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"os"
	"strings"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/internal/redact"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// ErrBadURL is wrapped by every error about the URL itself: no scheme, an
// unknown one, no file. Errors from opening a well-formed URL (a missing
// file, an unreachable server) do not wrap it.
var ErrBadURL = errors.New("bad store URL")

// Options say how Open opens a store.
type Options struct {
	// MustExist refuses to create a missing embedded store file, for a
	// program that only reads or changes existing tasks: a mistyped path
	// then fails instead of starting an empty store.
	MustExist bool
	// ReadOnly opens an embedded store file for reading only (implies
	// MustExist; see sqlitestore.Config.ReadOnly): nothing is written, and
	// a file that is not a leasepool store is refused. A MongoDB store has
	// no read-only mode and ignores it: a program that only reads simply
	// writes nothing.
	ReadOnly bool
	// Logger receives the store's background errors. Default slog.Default().
	Logger *slog.Logger
	// Monitor, if set, sees every command sent to a MongoDB server
	// (metrics.StoreTraffic counts them); an embedded store ignores it.
	Monitor *event.CommandMonitor
}

// Open opens the store url names. Close it when done.
func Open(ctx context.Context, url string, opts Options) (task.Store, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	scheme, rest, ok := strings.Cut(url, ":")
	shown := shownURL(url)
	switch {
	case url == "":
		return nil, fmt.Errorf("open store: %w: empty (want sqlite:PATH or mongodb://HOST/DB)", ErrBadURL)
	case scheme == "sqlite":
		return openSQLite(ctx, url, rest, opts, logger)
	case scheme == "mongodb" || scheme == "mongodb+srv":
		if !strings.HasPrefix(rest, "//") {
			return nil, fmt.Errorf("open store %q: %w: want %s://HOST/DB", shown, ErrBadURL, scheme)
		}
		s, err := mongostore.Open(ctx, url, &mongostore.Config{Logger: logger, Monitor: opts.Monitor})
		if err != nil {
			// The driver's own errors may quote the URL or its password.
			return nil, fmt.Errorf("open store %s: %w", shown, redact.Error(err, []string{url}))
		}
		return s, nil
	case !ok || strings.ContainsAny(scheme, `/\.`):
		return nil, fmt.Errorf("open store %q: %w: no scheme (for an embedded store file write sqlite:%s)", shown, ErrBadURL, shown)
	}
	return nil, fmt.Errorf("open store %q: %w: unknown scheme %q (want sqlite:PATH or mongodb://HOST/DB)", shown, ErrBadURL, scheme)
}

func openSQLite(ctx context.Context, url, rest string, opts Options, logger *slog.Logger) (task.Store, error) {
	path, cfg, err := sqliteConfig(rest)
	if err != nil {
		return nil, fmt.Errorf("open store %q: %w: %w", url, ErrBadURL, err)
	}
	if opts.MustExist || opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
	}
	cfg.Logger, cfg.ReadOnly = logger, opts.ReadOnly
	s, err := sqlitestore.Open(ctx, path, &cfg)
	if err != nil {
		return nil, err // it names the file already
	}
	return s, nil
}

// SQLiteFile returns the file an embedded store URL (sqlite:PATH, with or
// without parameters) names; ok is false for any other URL.
func SQLiteFile(url string) (path string, ok bool) {
	rest, ok := strings.CutPrefix(url, "sqlite:")
	if !ok {
		return "", false
	}
	path, _, _ = strings.Cut(rest, "?")
	return path, true
}

// SQLite returns the embedded store s is, for what only it offers
// (sqlitestore.Store.InTx: the program's own SQL and its tasks in one
// commit); ok is false for any other store.
func SQLite(s task.Store) (st *sqlitestore.Store, ok bool) {
	st, ok = s.(*sqlitestore.Store)
	return st, ok
}

// sqliteConfig reads what follows "sqlite:": the file, then optionally
// "?" and parameters. The one parameter is synchronous=full (the default)
// or synchronous=normal (sqlitestore.Config.Synchronous). A file name
// cannot hold a "?": SQLite's own URIs read the rest as parameters too.
func sqliteConfig(rest string) (path string, cfg sqlitestore.Config, err error) {
	path, query, _ := strings.Cut(rest, "?")
	if path == "" {
		return "", cfg, errors.New("names no file (want sqlite:PATH)")
	}
	params, err := neturl.ParseQuery(query)
	if err != nil {
		return "", cfg, fmt.Errorf("parameters: %w", err)
	}
	for name, values := range params {
		if name != "synchronous" {
			return "", cfg, fmt.Errorf("unknown parameter %q (the one known is synchronous)", name)
		}
		if len(values) > 1 {
			return "", cfg, fmt.Errorf("parameter %s given %d times", name, len(values))
		}
		switch v := sqlitestore.Synchronous(strings.ToLower(values[0])); v {
		case sqlitestore.SyncFull, sqlitestore.SyncNormal:
			cfg.Synchronous = v
		default:
			return "", cfg, fmt.Errorf("synchronous=%s: want full or normal", values[0])
		}
	}
	return path, cfg, nil
}

// shownURL is url as errors show it, which end up in logs: with its
// password hidden, even when the "//" that makes it a URL is missing
// ("mongodb:alice:pw@h/db", "alice:pw@h/db").
func shownURL(url string) string {
	if strings.Contains(url, "://") {
		return redact.URL(url)
	}
	return strings.TrimPrefix(redact.URL("x://"+url), "x://")
}
