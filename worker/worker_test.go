package worker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

func openStore(t *testing.T) task.Store {
	t.Helper()
	st, err := store.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "tasks.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestNewRefuses: a bad Config is refused with the field named.
func TestNewRefuses(t *testing.T) {
	st := openStore(t)
	for _, tc := range []struct {
		cfg   worker.Config
		field string
	}{
		{worker.Config{}, "Store"},
		{worker.Config{Store: st, Kinds: []string{"resize"}}, `Kinds: "resize" has no handler`},
		{worker.Config{Store: st, ID: "bad\x00id"}, "ID"},
		{worker.Config{Store: st, ID: "leasepool:flow-documents"}, "ID"},
		{worker.Config{Store: st, StoreFailTimeout: -1}, "StoreFailTimeout"},
		{worker.Config{Store: st, Kinds: []string{"exec"}, Exec: builtinConfigWithRelativePattern()}, "Allow"},
	} {
		_, err := worker.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v): %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	if _, err := worker.New(worker.Config{}); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("no store: %v, want task.ErrInvalid", err)
	}
}

// TestKinds: exec is registered only when named; the default is the
// built-in kinds that run no program plus the Mux's own.
func TestKinds(t *testing.T) {
	st := openStore(t)
	mux := consumer.NewMux()
	mux.RegisterFunc("resize", func(context.Context, *consumer.Job) error { return nil })
	w, err := worker.New(worker.Config{Store: st, Mux: mux})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.Kinds(), []string{"noop", "resize", "sleep"}; !slices.Equal(got, want) {
		t.Errorf("default kinds %v, want %v", got, want)
	}
	if slices.Contains(mux.Kinds(), "exec") {
		t.Error("exec registered though not named")
	}
	mux2 := consumer.NewMux()
	if _, err := worker.New(worker.Config{Store: st, Mux: mux2, Kinds: []string{"exec"}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mux2.Kinds(), "exec") {
		t.Error("exec named but not registered")
	}
}

// TestStartStop: a second worker under a live id refuses to start and
// leaves nothing running; Stop may be called again.
func TestStartStop(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	a, err := worker.New(worker.Config{Store: st, ID: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := worker.New(worker.Config{Store: st, ID: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); !errors.Is(err, task.ErrWorkerIDTaken) {
		t.Errorf("second worker under a live id: %v, want task.ErrWorkerIDTaken", err)
	}
	if err := a.Start(ctx); err == nil {
		t.Error("a second Start succeeded")
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func builtinConfigWithRelativePattern() builtin.ExecConfig {
	return builtin.ExecConfig{Allow: []string{"bin/*"}}
}

// TestStoreFailTimeoutRelativeFile: a worker whose embedded store was
// opened by a relative path, through a symbolic link to its directory,
// still sees its -wal file deleted under it and reports it on Failed once
// StoreFailTimeout has passed. Not parallel: it changes directory.
func TestStoreFailTimeoutRelativeFile(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(link)
	st, err := store.Open(context.Background(), "sqlite:tasks.db", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w, err := worker.New(worker.Config{Store: st, ID: "rel", StoreFile: "tasks.db", StoreFailTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	if err := os.Remove(filepath.Join(real, "tasks.db-wal")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.Failed():
		if !errors.Is(err, worker.ErrStoreFailing) || !strings.Contains(err.Error(), filepath.Join(real, "tasks.db-wal")) {
			t.Errorf("Failed = %v, want ErrStoreFailing naming %s", err, filepath.Join(real, "tasks.db-wal"))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the deleted -wal file of a store opened by a relative path went unseen for 20 s")
	}
}
