package sqlitestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func files(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestReadOnly: a store opened with Config.ReadOnly reads, refuses every
// write with ErrReadOnly, and leaves the directory as it found it; a file
// without a leasepool schema, or a missing one, is refused.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "leasepool.db")
	rw := open(t, path, nil)
	tk, err := task.NewTask(task.PublishParams{Key: "a", Kind: "k"}, rw.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rw.Insert(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	rw.Close()
	before := files(t, dir)
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	ro, err := sqlitestore.Open(context.Background(), path, &sqlitestore.Config{Logger: testLogger(t), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ro.Get(context.Background(), "a")
	if err != nil || got.Key != "a" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	if list, err := ro.List(context.Background(), task.ListQuery{}); err != nil || len(list) != 1 {
		t.Fatalf("List = %d tasks, %v", len(list), err)
	}
	next := got.Clone()
	next.Priority = 9
	if err := ro.Update(context.Background(), next); !errors.Is(err, sqlitestore.ErrReadOnly) {
		t.Errorf("Update = %v, want ErrReadOnly", err)
	}
	tk2, _ := task.NewTask(task.PublishParams{Key: "b", Kind: "k"}, ro.Now())
	if _, _, err := ro.Insert(context.Background(), tk2); !errors.Is(err, sqlitestore.ErrReadOnly) {
		t.Errorf("Insert = %v, want ErrReadOnly", err)
	}
	if _, err := ro.PutDocument(context.Background(), task.Document{Namespace: "x", ID: "y", Value: []byte(`{}`)}); !errors.Is(err, sqlitestore.ErrReadOnly) {
		t.Errorf("PutDocument = %v, want ErrReadOnly", err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if after := files(t, dir); !slices.Equal(before, after) {
		t.Errorf("files %v after a read-only open, were %v", after, before)
	}
	if after, err := os.Stat(path); err != nil || !after.ModTime().Equal(info.ModTime()) || after.Size() != info.Size() {
		t.Errorf("store file changed: %v, %v", after, err)
	}

	// Beside a writer that has the store open (its -wal and -shm exist),
	// the reader sees its commits.
	rw2 := open(t, path, nil)
	tk3, _ := task.NewTask(task.PublishParams{Key: "c", Kind: "k"}, rw2.Now())
	if _, _, err := rw2.Insert(context.Background(), tk3); err != nil {
		t.Fatal(err)
	}
	ro2, err := sqlitestore.Open(context.Background(), path, &sqlitestore.Config{Logger: testLogger(t), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro2.Get(context.Background(), "c"); err != nil {
		t.Errorf("Get of the writer's task = %v", err)
	}
	ro2.Close()
	rw2.Close()

	for _, p := range []string{filepath.Join(dir, "missing.db"), filepath.Join(dir, "empty.db")} {
		if filepath.Base(p) == "empty.db" {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if s, err := sqlitestore.Open(context.Background(), p, &sqlitestore.Config{Logger: testLogger(t), ReadOnly: true}); err == nil {
			s.Close()
			t.Errorf("read-only Open of %s succeeded", filepath.Base(p))
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "missing.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read-only Open created missing.db: %v", err)
	}
}
