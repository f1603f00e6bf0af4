package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPauseAndLimitCommands round-trips pauses and limits through the CLI
// and checks the listings, in text and JSON.
func TestPauseAndLimitCommands(t *testing.T) {
	t.Parallel()
	c := setup(t)
	if out := c.must("pause", "--lock", "device:pump-7"); !strings.Contains(out, "paused lock:device:pump-7") {
		t.Errorf("pause: %q", out)
	}
	if out := c.must("pause", "--lock", "device:pump-7"); !strings.Contains(out, "already paused") {
		t.Errorf("second pause: %q", out)
	}
	c.must("pause", "--all")
	var pauses []struct {
		Target struct{ Scope, Name string }
	}
	if err := json.Unmarshal([]byte(c.must("pauses", "--json")), &pauses); err != nil || len(pauses) != 2 || pauses[0].Target.Scope != "all" || pauses[1].Target.Name != "device:pump-7" {
		t.Fatalf("pauses --json = %+v, %v", pauses, err)
	}
	c.must("resume", "--all")
	if out := c.must("pauses"); strings.Contains(out, "all ") || !strings.Contains(out, "lock:device:pump-7") {
		t.Errorf("pauses after resume --all:\n%s", out)
	}

	c.must("limit", "set", "device:*", "--rate", "2/1s")
	c.must("limit", "set", "--kind", "mail", "--rate", "10/m")
	var limits []struct {
		Target struct{ Scope, Name string }
		N      int
		Per    string
	}
	if err := json.Unmarshal([]byte(c.must("limit", "ls", "--json")), &limits); err != nil || len(limits) != 2 ||
		limits[0].Target.Name != "mail" || limits[0].N != 10 || limits[0].Per != "1m0s" ||
		limits[1].Target.Name != "device:*" || limits[1].N != 2 || limits[1].Per != "1s" {
		t.Fatalf("limit ls --json = %+v, %v", limits, err)
	}
	if out := c.must("limit", "rm", "device:*"); !strings.Contains(out, "removed") {
		t.Errorf("limit rm: %q", out)
	}
	if out := c.must("limit", "ls"); strings.Contains(out, "device") || !strings.Contains(out, "kind:mail") {
		t.Errorf("limit ls after rm:\n%s", out)
	}
	// The doorbell every control write touches is not a task to list.
	if out := c.must("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("ls after control writes = %s, want no tasks", out)
	}
}

// TestGroupLimitCommands: limit set --group sets the parts given and
// keeps the others; limit ls shows them; publish --group stores the group.
func TestGroupLimitCommands(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("limit", "set", "--group", "acme", "--weight", "3")
	c.must("limit", "set", "--group", "acme", "--concurrency", "5")
	c.must("limit", "set", "tenant:*", "--concurrency", "2")
	out := c.must("limit", "ls")
	for _, want := range []string{"group:acme  -     3       5", "lock:tenant:*  -     -       2"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("limit ls:\n%s\nwant a row %q", out, want)
		}
	}
	c.must("publish", "job-1", "--kind", "noop", "--group", "acme")
	if show := c.must("show", "job-1"); !strings.Contains(show, "acme") {
		t.Errorf("show job-1 does not name its group:\n%s", show)
	}
	c.must("limit", "rm", "--group", "acme")
	if out := c.must("limit", "ls"); strings.Contains(out, "acme") {
		t.Errorf("limit ls after rm:\n%s", out)
	}
}
