package events_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// TestLoggedEvents: what a handler logs while it runs comes through the
// event stream as logged events, once each and in order, carried by its
// renewals and by its outcome write.
func TestLoggedEvents(t *testing.T) {
	s := openSQLite(t, filepath.Join(t.TempDir(), "store.db"))
	st := follow(t, s, events.Params{Key: "job"})
	mux := consumer.NewMux()
	mux.RegisterFunc("logs", func(ctx context.Context, job *consumer.Job) error {
		job.Log("sent")
		// Two renewals, at a 150 ms ping, as the store shows them.
		seen := map[time.Time]bool{}
		if !testutil.Within(5*time.Second, func() bool {
			if tk, err := s.Get(ctx, "job"); err == nil && len(tk.Attempts) > 0 {
				seen[tk.Attempts[len(tk.Attempts)-1].LeaseUntil] = true
			}
			return len(seen) > 2
		}) {
			return errors.New("the lease was not renewed twice")
		}
		job.Log("acked")
		job.Log("result ok")
		return nil
	})
	c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	p := task.PublishParams{Key: "job", Kind: "logs", Options: task.Options{PingInterval: 150 * time.Millisecond, WorkerTimeout: time.Second}}
	if _, _, err := task.Publish(context.Background(), s, p); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range read(t, st, 6) {
		s := e.Type
		if e.Type == events.Logged {
			s += " " + e.Message
			if e.Worker != "w1" || e.Attempt != 1 {
				t.Errorf("logged event %+v: want worker w1 attempt 1", e)
			}
		}
		got = append(got, s)
	}
	want := []string{"published", "claimed", "logged sent", "logged acked", "logged result ok", "succeeded"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	quiet(t, st)
}
