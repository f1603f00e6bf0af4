package mongostore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var dbSeq atomic.Int64

// freshDB names a database of this test run only.
func freshDB() string {
	return fmt.Sprintf("lp_%d_%d", time.Now().UnixNano()%1e12, dbSeq.Add(1))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// open opens a store on the shared test server, closed and dropped when t
// ends.
func open(t testing.TB, uri string, cfg mongostore.Config) *mongostore.Store {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tlogWriter{t}, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := mongostore.Open(ctx, uri, &cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

func TestStore(t *testing.T) {
	uri := testservers.MongoURI(t)
	storetest.Run(t, func(t *testing.T) storetest.Opened {
		st, cfg := openFresh(t, uri)
		return storetest.Opened{
			Store:  st,
			Reopen: func(t *testing.T) task.Store { return open(t, uri, cfg) },
		}
	})
}

// A host whose clock is 30s ahead still writes leases in server time.
func TestNowFollowsServerClock(t *testing.T) {
	t.Parallel()
	uri := testservers.MongoURI(t)
	ahead := func() time.Time { return time.Now().Add(30 * time.Second) }
	st := open(t, uri, mongostore.Config{Database: freshDB(), Clock: ahead, ClockRefresh: 50 * time.Millisecond})
	// The test server runs on this machine, so its clock is time.Now.
	if d := time.Since(st.Now()).Abs(); d > time.Second {
		t.Fatalf("Now() is %s away from the server clock (offset %s)", d, st.Offset())
	}
	if off := st.Offset(); off > -29*time.Second || off < -31*time.Second {
		t.Fatalf("offset %s; want about -30s", off)
	}
}

func TestCloseTwice(t *testing.T) {
	t.Parallel()
	st := open(t, testservers.MongoURI(t), mongostore.Config{Database: freshDB()})
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := st.Get(context.Background(), "x"); err == nil || !errors.Is(err, task.ErrClosed) {
		t.Fatalf("Get after Close: %v; want ErrClosed", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]mongostore.Config{
		"PollInterval":   {PollInterval: -1},
		"ClockRefresh":   {ClockRefresh: -1},
		"UpdateStreams":  {UpdateStreams: -1},
		"ConnectTimeout": {ConnectTimeout: -1},
		"Database":       {Database: "a.b"},
	} {
		_, err := mongostore.Open(context.Background(), "mongodb://127.0.0.1:1/", &cfg)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Open: %v; want ErrInvalid naming %s", field, err, field)
		}
	}
}
