package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOpenSQLiteCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	s, err := store.Open(t.Context(), "sqlite:"+path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*sqlitestore.Store); !ok {
		t.Errorf("Open(sqlite:) = %T, want *sqlitestore.Store", s)
	}
	if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: "k", Kind: "noop"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("store file not created: %v", err)
	}
}

func TestOpenSQLiteMustExist(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "missing.db")
	for _, opts := range []store.Options{{MustExist: true}, {ReadOnly: true}} {
		s, err := store.Open(t.Context(), "sqlite:"+path, opts)
		if err == nil {
			s.Close()
			t.Fatalf("%+v: opened a missing file", opts)
		}
		if !errors.Is(err, os.ErrNotExist) || errors.Is(err, store.ErrBadURL) || !strings.Contains(err.Error(), path) {
			t.Errorf("%+v: error %v, want a not-exist error naming %s", opts, err, path)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused opens left %d files", len(entries))
	}
}

func TestOpenSQLiteReadOnly(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "x.db")
	w, err := store.Open(ctx, "sqlite:"+path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := task.Publish(ctx, w, task.PublishParams{Key: "k", Kind: "noop"}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	r, err := store.Open(ctx, "sqlite:"+path, store.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := r.Get(ctx, "k"); err != nil || got.Key != "k" {
		t.Errorf("read-only Get = %v, %v", got, err)
	}
	if _, _, err := task.Publish(ctx, r, task.PublishParams{Key: "k2", Kind: "noop"}); !errors.Is(err, sqlitestore.ErrReadOnly) {
		t.Errorf("publish to a read-only store: %v, want ErrReadOnly", err)
	}
}

func TestOpenSQLiteReadOnlyRefusesEmptyFile(t *testing.T) {
	// An empty file is a valid, empty SQLite database: the schema check
	// refuses it, not SQLite.
	path := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(t.Context(), "sqlite:"+path, store.Options{ReadOnly: true})
	if err == nil {
		s.Close()
		t.Fatal("opened an empty file as a store")
	}
	if !strings.Contains(err.Error(), "not a leasepool store") {
		t.Errorf("error %v, want one saying it is not a leasepool store", err)
	}
}

func TestOpenMongo(t *testing.T) {
	uri := testservers.MongoURI(t)
	// A database of its own: the URI of the shared server names none.
	base, query, _ := strings.Cut(uri, "?")
	uri = strings.TrimSuffix(base, "/") + "/storepkg_" + strings.ToLower(t.Name()) + "?" + query
	ctx, cancel := context.WithTimeout(t.Context(), testservers.StartTimeout)
	defer cancel()
	s, err := store.Open(ctx, uri, store.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*mongostore.Store); !ok {
		t.Errorf("Open(mongodb://) = %T, want *mongostore.Store", s)
	}
	if _, err := s.List(ctx, task.ListQuery{Limit: 1}); err != nil {
		t.Errorf("List: %v", err)
	}
}

// TestOpenSQLiteSynchronous: an embedded store URL with the synchronous
// parameter opens the file before the "?" and writes to it.
func TestOpenSQLiteSynchronous(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"normal", "full"} {
		path := filepath.Join(dir, v+".db")
		s, err := store.Open(t.Context(), "sqlite:"+path+"?synchronous="+v, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: "k", Kind: "noop"}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := os.Stat(path); err != nil {
			t.Errorf("synchronous=%s: store file not created: %v", v, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*\\?*"))
	if len(files) != 0 {
		t.Errorf("files named with the parameters: %v", files)
	}
}

// TestOpenBadURL: each malformed URL is refused before anything is
// opened, with ErrBadURL and a one-line message naming the problem.
func TestOpenBadURL(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for url, want := range map[string]string{
		"":                            "empty",
		"x.db":                        "no scheme (for an embedded store file write sqlite:x.db)",
		"./data/x:1.db":               "no scheme",
		"sqlite:":                     "names no file",
		"foo:x":                       `unknown scheme "foo"`,
		"postgres://h/db":             `unknown scheme "postgres"`,
		"mongodb:h/db":                "want mongodb://HOST/DB",
		"mongodb+srv:cluster/db":      "want mongodb+srv://HOST/DB",
		"sqlite:?synchronous=normal":  "names no file",
		"sqlite:x.db?synchronous=off": "synchronous=off: want full or normal",
		"sqlite:x.db?synchronous=":    "synchronous=: want full or normal",
		"sqlite:x.db?synchronous=full&synchronous=normal":    "parameter synchronous given 2 times",
		"sqlite:x.db?sync=normal":                            `unknown parameter "sync"`,
		"sqlite:x.db?synchronous=normal&journal_mode=delete": `unknown parameter "journal_mode"`,
		"sqlite:x.db?synchronous=%zz":                        "parameters: invalid URL escape",
	} {
		s, err := store.Open(t.Context(), url, store.Options{})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", url)
			continue
		}
		msg := err.Error()
		if !errors.Is(err, store.ErrBadURL) || !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("Open(%q) = %q, want one line wrapping ErrBadURL and saying %q", url, msg, want)
		}
		if url != "" && !strings.Contains(msg, url) {
			t.Errorf("Open(%q) = %q, want it to name the URL", url, msg)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bad URLs left %d files", len(entries))
	}
}

// TestOpenMongoErrorHidesPassword: a URL the driver refuses is reported
// without its password.
func TestOpenMongoErrorHidesPassword(t *testing.T) {
	s, err := store.Open(t.Context(), "mongodb://alice:s3cret@127.0.0.1:1/db?bogusOption=1&connectTimeoutMS=-5", store.Options{})
	if err == nil {
		s.Close()
		t.Fatal("opened an invalid MongoDB URL")
	}
	if msg := err.Error(); strings.Contains(msg, "s3cret") || !strings.Contains(msg, "alice:xxxxx@127.0.0.1:1") {
		t.Errorf("error %q: want the URL named with its password hidden", msg)
	}
	if !errors.Is(err, task.ErrInvalid) {
		t.Errorf("error %v: want task.ErrInvalid for a URL the driver cannot parse", err)
	}
}

// TestOpenMongoSRV: a mongodb+srv URL goes to the MongoDB driver, which
// looks its seed list up in DNS (.invalid never resolves), not to ErrBadURL.
func TestOpenMongoSRV(t *testing.T) {
	s, err := store.Open(t.Context(), "mongodb+srv://bob:hunter2@cluster.invalid/db", store.Options{})
	if err == nil {
		s.Close()
		t.Fatal("opened a seed list that does not resolve")
	}
	msg := err.Error()
	if errors.Is(err, store.ErrBadURL) || !strings.Contains(msg, "_mongodb._tcp.cluster.invalid") {
		t.Errorf("error %q: want the driver's seed list lookup failing", msg)
	}
	if strings.Contains(msg, "hunter2") || !strings.Contains(msg, "mongodb+srv://bob:xxxxx@cluster.invalid/db") {
		t.Errorf("error %q: want the URL named with its password hidden", msg)
	}
}

// TestOpenErrorsHidePasswords: every error about a store URL, malformed
// or refused by the driver, names the URL with its password hidden,
// whatever characters the password holds.
func TestOpenErrorsHidePasswords(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, tt := range []struct{ url, secret, shows string }{
		{"mongodb://alice:pa?ss77@127.0.0.1:1/db?connectTimeoutMS=-5", "pa?ss77", "alice:xxxxx@127.0.0.1:1"},
		{"mongodb://alice:p#ss77@127.0.0.1:1/db?connectTimeoutMS=-5", "ss77", "alice:xxxxx@127.0.0.1:1"},
		{"mongodb://alice:p@ss/77@127.0.0.1:1/db", "ss/77", "alice:xxxxx@127.0.0.1:1"},
		{"mongodb://alice:p%3Fss%4077@127.0.0.1:1/db?connectTimeoutMS=-5", "ss%4077", "alice:xxxxx@127.0.0.1:1"},
		{"mongodb://alice:pw%zzsecret77@127.0.0.1:1/db", "secret77", "alice:xxxxx@127.0.0.1:1"},
		{"mongodb:alice:secret77@h/db", "secret77", "mongodb:xxxxx@h/db"},
		{"alice:secret77@h/db", "secret77", "alice:xxxxx@h/db"},
		{"mongo://alice:secret77@h/db", "secret77", "mongo://alice:xxxxx@h/db"},
	} {
		s, err := store.Open(t.Context(), tt.url, store.Options{})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", tt.url)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, tt.secret) || !strings.Contains(msg, tt.shows) {
			t.Errorf("Open(%q) = %q: want %q shown and %q hidden", tt.url, msg, tt.shows, tt.secret)
		}
	}
}
