package main

import (
	"strings"
	"testing"
)

// TestExecGuardFlag: the worker runs its exec programs under the binary
// --exec-guard names (the tests' workers name the CLI's plain build), and
// one that does not exist stops the worker before it claims anything.
func TestExecGuardFlag(t *testing.T) {
	c := setup(t)
	_, stderr, code := c.runStderr("worker", "--kinds", "exec", "--exec-guard", "/nonexistent/guard")
	if code == exitOK || !strings.Contains(stderr, "GuardPath") || !strings.Contains(stderr, "/nonexistent/guard") {
		t.Fatalf("worker with a missing --exec-guard: exit %d, stderr %q", code, stderr)
	}
}
