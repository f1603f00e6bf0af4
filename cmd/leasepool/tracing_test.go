package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
)

// A TRACEPARENT the CLI cannot continue is bad input naming the variable,
// with nothing written; so is an exporter it does not have.
func TestBadTraceEnvironment(t *testing.T) {
	c := setup(t)
	c.must("publish", "before", "--kind", "noop")
	t.Setenv("TRACEPARENT", "00-xyz-01")
	_, err := c.run("publish", "k", "--kind", "noop")
	if !errors.Is(err, task.ErrInvalid) || !strings.HasPrefix(err.Error(), "invalid: TRACEPARENT: ") || exitStatus(err) != exitBadInput {
		t.Fatalf("publish with a bad TRACEPARENT: %v; want invalid naming TRACEPARENT", err)
	}
	t.Setenv("TRACEPARENT", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	t.Setenv("TRACESTATE", "no list")
	if _, err := c.run("publish", "k", "--kind", "noop"); err == nil || !strings.Contains(err.Error(), "TRACESTATE: ") {
		t.Fatalf("publish with a bad TRACESTATE: %v; want an error naming it", err)
	}
	t.Setenv("TRACESTATE", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	if _, err := c.run("publish", "k", "--kind", "noop"); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER: ") {
		t.Fatalf("publish with OTEL_TRACES_EXPORTER=console: %v; want an error naming it", err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	if out := c.must("ls", "--json"); strings.Contains(out, `"k"`) {
		t.Fatalf("a refused publish wrote: %s", out)
	}
	// A valid one is kept with the task.
	c.must("publish", "k", "--kind", "noop")
	if tr := string(c.show("k")["trace"]); !strings.Contains(tr, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") {
		t.Fatalf("stored trace %s; want TRACEPARENT's", tr)
	}
}
