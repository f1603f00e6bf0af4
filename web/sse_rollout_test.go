package web_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/web"
)

// rolloutEvents reads n rollout events from c as "type rollout seq".
func (c *sseClient) rolloutEvents(n int) (ids, got []string) {
	c.t.Helper()
	timeout := time.After(30 * time.Second)
	for len(got) < n {
		select {
		case m := <-c.msgs:
			if m.data == "" {
				continue
			}
			var ev events.Event
			if err := json.Unmarshal([]byte(m.data), &ev); err != nil {
				c.t.Fatal(err)
			}
			if ev.Token != m.id {
				c.t.Fatalf("id %q differs from the event's token %q", m.id, ev.Token)
			}
			ids = append(ids, m.id)
			got = append(got, ev.Type+" "+ev.Rollout+" "+string(ev.State))
		case <-timeout:
			c.t.Fatalf("%d rollout events within 30s, want %d: %q", len(got), n, got)
		}
	}
	return ids, got
}

// TestRolloutEventsOverSSE follows one rollout's events (?rollout=), drops
// the connection and resumes with Last-Event-ID: each event once, in order;
// another rollout's and tasks' events stay out.
func TestRolloutEventsOverSSE(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token, Heartbeat: 20 * time.Millisecond})
	ctx := t.Context()
	c := e.openSSE("/api/v1/events?rollout=fw", "")
	spec := rollout.Spec{Command: "update", Devices: []string{"d1", "d2"}}
	for _, name := range []string{"other", "fw"} {
		if _, err := rollout.Create(ctx, e.store, name, spec); err != nil {
			t.Fatal(err)
		}
	}
	e.pub("a", "k1")
	if _, err := rollout.Pause(ctx, e.store, "fw"); err != nil {
		t.Fatal(err)
	}
	ids, got := c.rolloutEvents(2)
	if want := []string{"rollout.created fw running", "rollout.paused fw paused"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	c.close()
	if _, err := rollout.Resume(ctx, e.store, "fw"); err != nil {
		t.Fatal(err)
	}
	r := e.openSSE("/api/v1/events?rollout=fw&type=rollout.paused,rollout.resumed", ids[0])
	if _, got := r.rolloutEvents(2); !slices.Equal(got, []string{"rollout.paused fw paused", "rollout.resumed fw running"}) {
		t.Fatalf("resumed after the first: %q", got)
	}
	if _, err := rollout.Pause(ctx, e.store, "fw"); err != nil {
		t.Fatal(err)
	}
	if _, got := r.rolloutEvents(1); got[0] != "rollout.paused fw paused" {
		t.Fatalf("after the resumed events: %q, want the next pause", got)
	}
}
