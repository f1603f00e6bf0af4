package events_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/task"
)

// TestFastTasksMongo: tasks a real worker runs as fast as it can (its
// outcome written right after its claim, before a follower's change stream
// looks the claim's document up) still give a follower that keeps up
// published, claimed and succeeded, in that order, once each; and a
// follower resumed from the first event's token gets the same.
func TestFastTasksMongo(t *testing.T) {
	s := openMongo(t, "lp_events_fast")
	live := follow(t, s, events.Params{})
	mux := consumer.NewMux()
	mux.RegisterFunc("fast", func(ctx context.Context, job *consumer.Job) error { return nil })
	c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	const n = 30
	for i := range n {
		p := task.PublishParams{Key: fmt.Sprint("fast-", i), Kind: "fast"}
		if _, _, err := task.Publish(context.Background(), s, p); err != nil {
			t.Fatal(err)
		}
	}
	all := read(t, live, 3*n)
	checkFast(t, "live", all, n)
	quiet(t, live)

	resumed := follow(t, s, events.Params{After: all[0].Token})
	rest := read(t, resumed, 3*n-1)
	if g, w := lines(rest), lines(all[1:]); !slices.Equal(g, w) {
		t.Errorf("resumed after the first event:\n got %q\nwant %q", g, w)
	}
	quiet(t, resumed)
}

// checkFast checks that evs holds published, claimed w1#1 and succeeded
// w1#1 for each of n fast tasks, in that order per task.
func checkFast(t *testing.T, name string, evs []events.Event, n int) {
	t.Helper()
	per := map[string][]string{}
	for _, e := range evs {
		per[e.Key] = append(per[e.Key], line(e))
	}
	for i := range n {
		k := fmt.Sprint("fast-", i)
		want := []string{"published " + k, "claimed " + k + " w1#1", "succeeded " + k + " w1#1"}
		if !slices.Equal(per[k], want) {
			t.Errorf("%s: %s: events %q, want %q", name, k, per[k], want)
		}
	}
	for _, e := range evs {
		if e.Type == events.Claimed && (e.State != task.StateRunning || e.At.IsZero() || e.Version < 2) {
			t.Errorf("%s: claimed event %+v: want state running, its write's time and version", name, e)
		}
	}
}
