package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/internal/tracing/tracingsdk"
	"github.com/leasepool/leasepool/task"
)

// startTracing starts OpenTelemetry when the OTEL_* variables ask for it
// (see internal/tracing/tracingsdk.Setup); a setting it cannot honour is bad input.
func startTracing(c *cli.Context) (func(context.Context) error, error) {
	shutdown, err := tracingsdk.Setup(c.Context)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", task.ErrInvalid, err)
	}
	return shutdown, nil
}

// publishContext is the context of a command that publishes: it carries
// the trace context of TRACEPARENT and TRACESTATE, as an exec program of a
// traced task receives them, so that what it publishes continues that
// trace.
func publishContext(c *cli.Context) (context.Context, error) {
	tp, ts := tracing.FromEnv()
	if tp == "" {
		return c.Context, nil
	}
	if err := tracing.Check("TRACEPARENT", "TRACESTATE", tp, ts); err != nil {
		return nil, fmt.Errorf("%w: %w", task.ErrInvalid, err)
	}
	return tracing.Extract(c.Context, tp, ts), nil
}
