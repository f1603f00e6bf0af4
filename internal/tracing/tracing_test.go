package tracing

import (
	"context"
	"slices"
	"strings"
	"testing"
)

const (
	parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	state  = "vendor=a,other=b"
)

func TestInjectExtract(t *testing.T) {
	if tp, ts := Inject(context.Background()); tp != "" || ts != "" {
		t.Fatalf("Inject of a context without a span: %q %q", tp, ts)
	}
	ctx := Extract(context.Background(), parent, state)
	if tp, ts := Inject(ctx); tp != parent || ts != state {
		t.Fatalf("Inject(Extract) = %q %q; want %q %q", tp, ts, parent, state)
	}
	if got := Environ(ctx); !slices.Equal(got, []string{"TRACEPARENT=" + parent, "TRACESTATE=" + state}) {
		t.Fatalf("Environ = %q", got)
	}
	if got := Environ(context.Background()); got != nil {
		t.Fatalf("Environ without a span = %q", got)
	}
	bad := Extract(context.Background(), "00-zz-01", "")
	if tp, _ := Inject(bad); tp != "" {
		t.Fatalf("an invalid traceparent was carried on: %q", tp)
	}
}

func TestCheckNamesTheField(t *testing.T) {
	for _, c := range []struct{ tp, ts, field string }{
		{"00-0-0-01", "", "trace.traceparent"},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", "trace.traceparent"}, // all-zero trace id
		{"", state, "trace.tracestate"},
		{parent, "no equals sign", "trace.tracestate"},
		{parent, strings.Repeat("a=b,", 200), "trace.tracestate"},
	} {
		err := Check("trace.traceparent", "trace.tracestate", c.tp, c.ts)
		if err == nil || !strings.HasPrefix(err.Error(), c.field+":") {
			t.Errorf("Check(%q, %q) = %v; want an error naming %s", c.tp, c.ts, err, c.field)
		}
	}
	if err := Check("trace.traceparent", "trace.tracestate", parent, state); err != nil {
		t.Errorf("a valid context refused: %v", err)
	}
	if err := Check("trace.traceparent", "trace.tracestate", "", ""); err != nil {
		t.Errorf("no context refused: %v", err)
	}
}

// With no provider installed nothing is started: no span, the context
// unchanged, or carrying only the stored context.
func TestOffStartsNothing(t *testing.T) {
	if On() {
		t.Fatal("tracing is on with no provider installed")
	}
	ctx := context.Background()
	if c, s := StartPublish(ctx, "k", "key"); c != ctx || s != nil {
		t.Fatal("StartPublish made a span while off")
	}
	c, s := StartRun(ctx, Run{Kind: "k", Traceparent: parent})
	if s != nil {
		t.Fatal("StartRun made a span while off")
	}
	if tp, _ := Inject(c); tp != parent {
		t.Fatalf("StartRun off did not carry the stored context: %q", tp)
	}
	s.End(nil) // a nil span does nothing
	Event(c, "nothing")
}
