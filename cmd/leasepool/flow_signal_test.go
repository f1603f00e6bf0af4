package main

import (
	"strings"
	"testing"
)

const approvalFlowJSON = `{"steps": [
  {"name": "approval", "type": "signal", "timeout": "24h", "default": {"approved": false}},
  {"name": "create", "kind": "noop", "needs": ["approval"]},
  {"name": "cool-down", "sleep": "10m", "needs": ["create"]}
]}`

// TestFlowSignal: `flow signal` ends a signal step's wait once; bad input
// exits 2 naming what is wrong, refusals exit 1.
func TestFlowSignal(t *testing.T) {
	c := setup(t)
	if out := c.must("flow", "publish", "vm-1", "--file", writeFile(t, approvalFlowJSON)); out != "inserted vm-1 (running)\n" {
		t.Fatalf("publish printed %q", out)
	}
	for _, bad := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"vm-1"}, "want KEY and STEP", exitBadInput},
		{[]string{"vm-1", "approval", "--payload", `{"ok":`}, "payload", exitBadInput},
		{[]string{"vm-1", "create"}, "STEP: flow vm-1: step create is a task step: not a signal step", exitBadInput},
		{[]string{"vm-1", "nope"}, "flow step not found", exitFailed},
		{[]string{"nope", "approval"}, "flow not found", exitFailed},
	} {
		_, err := c.run(append([]string{"flow", "signal"}, bad.args...)...)
		if err == nil || exitStatus(err) != bad.code || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("flow signal %v: %v (exit %d); want %q, exit %d", bad.args, err, exitStatus(err), bad.want, bad.code)
		}
	}
	if out := c.must("flow", "signal", "vm-1", "approval", "--payload", `{"approved": true}`); !strings.HasPrefix(out, "signalled vm-1 approval: running") {
		t.Errorf("signal printed %q", out)
	}
	_, err := c.run("flow", "signal", "vm-1", "approval", "--payload", `{"approved": false}`)
	if err == nil || exitStatus(err) != exitFailed || !strings.Contains(err.Error(), "already signalled") {
		t.Errorf("second signal: %v; want refused, exit 1", err)
	}
	if out := c.must("flow", "show", "vm-1", "--json"); !strings.Contains(out, `"approval": {`) || !strings.Contains(out, `"approved": true`) {
		t.Errorf("the payload is not the step's result:\n%s", out)
	}
}
