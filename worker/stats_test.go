package worker_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/stats"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

// TestWorkerRecordsCharts: a worker counts the outcomes it writes for the
// dashboard's charts, and Stop writes what it counted last.
func TestWorkerRecordsCharts(t *testing.T) {
	st := openStore(t)
	mux := consumer.NewMux()
	mux.RegisterFunc("ok", func(context.Context, *consumer.Job) error { return nil })
	mux.RegisterFunc("bad", func(context.Context, *consumer.Job) error { return errors.New("no") })
	w, err := worker.New(worker.Config{Store: st, Mux: mux, Kinds: []string{"ok", "bad"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 5 {
		kind := "ok"
		if i%2 == 1 {
			kind = "bad"
		}
		key := kind + strconv.Itoa(i)
		keys = append(keys, key)
		if _, _, err := task.Publish(t.Context(), st, task.PublishParams{Key: key, Kind: kind,
			Options: task.Options{MaxUnexpectedRetries: task.NoRetries}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range keys {
		testutil.Eventually(t, time.Minute, key+" to finish", func() bool {
			tk, err := st.Get(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			return tk.State.Finished()
		})
	}
	if err := w.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	s, err := stats.Read(t.Context(), st, stats.Minute, st.Now(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sum("ok"); got != (stats.Counts{Succeeded: 3}) {
		t.Errorf("ok: %+v, want 3 succeeded", got)
	}
	if got := s.Sum("bad"); got != (stats.Counts{Failed: 2}) {
		t.Errorf("bad: %+v, want 2 failed", got)
	}
}
