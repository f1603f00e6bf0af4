package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// `leasepool events` prints a rollout's events beside tasks', one line
// each, and --rollout keeps one rollout's.
func TestEventsOfARollout(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("rollout", "create", "fw", "--command", "update", "--devices", "d1,d2")
	c.must("rollout", "pause", "fw")
	c.must("publish", "e1", "--kind", "noop")
	lines := c.follow(2, "--since", "MA", "--rollout", "fw")
	if !strings.Contains(lines[0], "rollout.created fw wave 1 2 devices in 1 waves") ||
		!strings.Contains(lines[1], "rollout.paused fw wave 1") {
		t.Errorf("text lines %q", lines)
	}
	var e struct{ Event, Rollout, State, Token string }
	if err := json.Unmarshal([]byte(c.follow(1, "--json", "--since", "MA", "--event", "rollout.paused")[0]), &e); err != nil {
		t.Fatal(err)
	}
	if e.Event != "rollout.paused" || e.Rollout != "fw" || e.State != "paused" || e.Token == "" {
		t.Errorf("JSON line %+v", e)
	}
}
