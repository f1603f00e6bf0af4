package web

import (
	"context"
	"fmt"
	"net/http"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// traced returns r's context carrying the W3C trace context of its
// traceparent and tracestate headers, so that the tasks and flows the
// request publishes continue the caller's trace. A header that is not
// valid is refused (400), naming it, rather than starting a trace the
// caller did not mean.
func traced(r *http.Request) (context.Context, error) {
	tp, ts := tracing.FromHeader(r.Header)
	if tp == "" {
		return r.Context(), nil // a tracestate alone means nothing (W3C)
	}
	if err := tracing.Check("traceparent header", "tracestate header", tp, ts); err != nil {
		return nil, fmt.Errorf("%w: %w", task.ErrInvalid, err)
	}
	return tracing.Extract(r.Context(), tp, ts), nil
}
