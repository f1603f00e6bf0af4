package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestScheduleCommands adds, lists, pauses, resumes and removes schedules,
// and checks that bad flags are usage errors naming the field.
func TestScheduleCommands(t *testing.T) {
	c := setup(t)
	c.must("schedule", "add", "nightly", "--cron", "0 30 2 * * 1-5", "--tz", "Europe/Berlin", "--kind", "exec",
		"--payload", `{"argv":["true"]}`, "--retries", "0", "--lock", "db", "--catch-up", "all:3")
	c.must("schedule", "add", "tick", "--every", "10s", "--kind", "noop", "--start", "2026-01-01T00:00:00Z")
	if _, err := c.run("schedule", "add", "tick", "--every", "10s", "--kind", "noop"); err == nil || exitStatus(err) != exitFailed {
		t.Errorf("adding an existing schedule: %v", err)
	}
	c.must("schedule", "add", "tick", "--every", "5s", "--kind", "noop", "--replace")
	c.must("schedule", "pause", "nightly")
	var list []struct {
		Name     string `json:"name"`
		Cron     string `json:"cron"`
		Every    string `json:"every"`
		CatchUp  string `json:"catch_up"`
		Paused   bool   `json:"paused"`
		NextSlot string `json:"next_slot"`
		Template struct {
			Kind    string          `json:"kind"`
			Payload json.RawMessage `json:"payload"`
			Retries int             `json:"max_unexpected_retries"`
			Locks   []string        `json:"lock_keys"`
		} `json:"template"`
	}
	if err := json.Unmarshal([]byte(c.must("schedule", "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "nightly" || !list[0].Paused || list[0].CatchUp != "all:3" ||
		list[0].Template.Retries != -1 || strings.Join(list[0].Template.Locks, ",") != "db" ||
		list[1].Every != "5s" || list[1].Paused || list[1].NextSlot == "" {
		t.Errorf("schedule ls --json = %+v", list)
	}
	c.must("schedule", "resume", "nightly")
	if out := c.must("schedule", "ls"); !strings.Contains(out, "nightly") || strings.Contains(out, "paused") {
		t.Errorf("schedule ls after resume:\n%s", out)
	}
	c.must("schedule", "rm", "tick")
	if _, err := c.run("schedule", "rm", "tick"); err == nil || exitStatus(err) != exitFailed {
		t.Errorf("removing a missing schedule: %v", err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"schedule", "add", "x", "--kind", "noop"}, "cron:"},
		{[]string{"schedule", "add", "x", "--every", "1s", "--cron", "* * * * *", "--kind", "noop"}, "every:"},
		{[]string{"schedule", "add", "x", "--cron", "* * * * * * * *", "--kind", "noop"}, "cron:"},
		{[]string{"schedule", "add", "x", "--cron", "* * * * *", "--tz", "Nowhere/Else", "--kind", "noop"}, "tz:"},
		{[]string{"schedule", "add", "x", "--every", "1m", "--catch-up", "some", "--kind", "noop"}, "catch_up:"},
		{[]string{"schedule", "add", "x", "--every", "1m"}, "--kind"},
		{[]string{"schedule", "add", "x", "--every", "1m", "--kind", "noop", "--start", "2026-01-02T00:00:00Z", "--end", "2026-01-01T00:00:00Z"}, "end:"},
		{[]string{"schedule", "add", "--every", "1m", "--kind", "noop"}, "NAME"},
	} {
		_, err := c.run(bad.args...)
		if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want a one-line usage error naming %s", bad.args, err, bad.want)
		}
	}
	if out := c.must("schedule", "ls"); strings.Contains(out, "x ") {
		t.Errorf("a refused schedule was stored:\n%s", out)
	}
}
