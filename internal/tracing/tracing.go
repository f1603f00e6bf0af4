// Package tracing is leasepool's one door to OpenTelemetry's API: it
// starts the spans of a publish and of an attempt, and carries W3C trace
// context (traceparent, tracestate) in and out of task documents, HTTP
// headers, exec programs' environments and device commands. The rest of
// the code passes only context.Context and strings. The SDK, which
// exports spans, is started by programs only (package tracingsdk), so a
// library that imports task links none of it.
//
// Spans are made only when a tracer provider other than OpenTelemetry's
// default is installed (by tracingsdk.Setup, or by a program embedding
// leasepool that called otel.SetTracerProvider): with none, every function here costs a
// pointer comparison, or a context lookup where a trace context may be
// carried on. A context already in a task is carried on even then, so an
// exec program or a device still joins its publisher's trace.
//
// It imports nothing of leasepool's, so every package, task included, may
// import it.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of leasepool's spans.
const ScopeName = "github.com/leasepool/leasepool"

// System is messaging.system on every span.
const System = "leasepool"

// defaultProvider is the global provider before anyone set one: while it
// is still the global one, tracing is off.
var defaultProvider = otel.GetTracerProvider()

// cached is the tracer of the provider last seen, so a span start does not
// look the tracer up by name (a lock in the SDK) every time.
type cached struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
}

var current atomic.Pointer[cached]

// tracer returns the tracer to start spans with, or nil when tracing is
// off. Comparing interfaces of different dynamic types is false, never a
// panic, whatever provider a program installed.
func tracer() trace.Tracer {
	tp := otel.GetTracerProvider()
	if tp == defaultProvider {
		return nil
	}
	if c := current.Load(); c != nil && c.provider == tp {
		return c.tracer
	}
	c := &cached{provider: tp, tracer: tp.Tracer(ScopeName)}
	current.Store(c)
	return c.tracer
}

// On reports whether spans are being made.
func On() bool { return tracer() != nil }

var propagator = propagation.TraceContext{}

// Inject returns the W3C trace context of ctx's span: empty strings when
// ctx carries none.
func Inject(ctx context.Context) (traceparent, tracestate string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// Extract returns ctx carrying the remote span context traceparent and
// tracestate describe, or ctx as it is when traceparent is empty or not
// valid.
func Extract(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return propagator.Extract(ctx, c)
}

// Check reports whether traceparent and tracestate are a valid W3C trace
// context; its error names the one at fault as tpName or tsName (the
// field, header or variable the caller read it from). Empty strings are
// valid (no context), but a tracestate needs a traceparent.
func Check(tpName, tsName, traceparent, tracestate string) error {
	if traceparent == "" {
		if tracestate != "" {
			return fmt.Errorf("%s: given without a %s", tsName, tpName)
		}
		return nil
	}
	if len(traceparent) > 256 {
		return fmt.Errorf("%s: %d bytes is too long", tpName, len(traceparent))
	}
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		return fmt.Errorf("%s: %q is not a W3C traceparent (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)", tpName, traceparent)
	}
	if tracestate != "" {
		if len(tracestate) > 512 {
			return fmt.Errorf("%s: %d bytes is too long (512 at most)", tsName, len(tracestate))
		}
		if _, err := trace.ParseTraceState(tracestate); err != nil {
			return fmt.Errorf("%s: %w", tsName, err)
		}
	}
	return nil
}

// FromHeader returns the trace context of an HTTP request's traceparent
// and tracestate headers.
func FromHeader(h http.Header) (traceparent, tracestate string) {
	return h.Get("traceparent"), h.Get("tracestate")
}

// FromEnv returns the trace context of this process's TRACEPARENT and
// TRACESTATE variables, as exec programs receive it (Environ).
func FromEnv() (traceparent, tracestate string) {
	return os.Getenv("TRACEPARENT"), os.Getenv("TRACESTATE")
}

// Environ returns the variables that hand ctx's trace context to a child
// process: TRACEPARENT and, when there is one, TRACESTATE; none without a
// context.
func Environ(ctx context.Context) []string {
	tp, ts := Inject(ctx)
	if tp == "" {
		return nil
	}
	env := []string{"TRACEPARENT=" + tp}
	if ts != "" {
		env = append(env, "TRACESTATE="+ts)
	}
	return env
}

// Attr is an attribute of a span or an event.
type Attr = attribute.KeyValue

// String and Int make attributes.
func String(key, value string) Attr  { return attribute.String(key, value) }
func Int(key string, value int) Attr { return attribute.Int(key, value) }
func Bool(key string, value bool) Attr {
	return attribute.Bool(key, value)
}

// Span is a span leasepool started; a nil *Span (tracing off) does
// nothing, so callers need not check.
type Span struct{ s trace.Span }

// SetAttributes adds attributes to the span.
func (s *Span) SetAttributes(attrs ...Attr) {
	if s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// End ends the span, marked as an error when err is not nil.
func (s *Span) End(err error) { s.EndAt(err, time.Time{}) }

// EndAt is End at a time past (zero: now), for a span recorded once what
// it stands for is over.
func (s *Span) EndAt(err error, at time.Time) {
	if s == nil {
		return
	}
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, firstLine(err.Error()))
	}
	if at.IsZero() {
		s.s.End()
		return
	}
	s.s.End(trace.WithTimestamp(at))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Event adds an event to the span of ctx, when it is one being recorded.
func Event(ctx context.Context, name string, attrs ...Attr) {
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return
	}
	s.AddEvent(name, trace.WithAttributes(attrs...))
}

// StartPublish starts the producer span of a publish of a task of kind and
// key, a child of ctx's span: ctx is returned unchanged and the span is
// nil when tracing is off.
func StartPublish(ctx context.Context, kind, key string) (context.Context, *Span) {
	t := tracer()
	if t == nil {
		return ctx, nil
	}
	ctx, s := t.Start(ctx, "publish "+kind, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", System),
		attribute.String("messaging.operation.name", "publish"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", kind),
		attribute.String("messaging.message.id", key),
	))
	return ctx, &Span{s}
}

// StartFlow starts the span of a flow's publish: the flow's span, parent
// of its steps' publishes, timers and signals.
func StartFlow(ctx context.Context, key string) (context.Context, *Span) {
	t := tracer()
	if t == nil {
		return ctx, nil
	}
	ctx, s := t.Start(ctx, "publish flow", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", System),
		attribute.String("messaging.operation.name", "publish"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("leasepool.flow.key", key),
	))
	return ctx, &Span{s}
}

// StartRollout starts the span of a rollout's creation: the rollout's
// span, parent of its device tasks' publishes.
func StartRollout(ctx context.Context, name string) (context.Context, *Span) {
	t := tracer()
	if t == nil {
		return ctx, nil
	}
	ctx, s := t.Start(ctx, "publish rollout", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", System),
		attribute.String("messaging.operation.name", "publish"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("leasepool.rollout.name", name),
	))
	return ctx, &Span{s}
}

// StartInternal starts an internal span name, a child of ctx's span.
func StartInternal(ctx context.Context, name string, attrs ...Attr) (context.Context, *Span) {
	t := tracer()
	if t == nil {
		return ctx, nil
	}
	ctx, s := t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return ctx, &Span{s}
}

// Run describes an attempt for StartRun.
type Run struct {
	Kind, Key, WorkerID string
	Attempt             int
	// Wait is how long the task waited between becoming claimable (its
	// publish, run_at, retry time or the lease it took over ending) and
	// the claim; negative when not known (not recorded).
	Wait time.Duration
	// Started is when the attempt began, for a span recorded once the
	// attempt is over (a remote worker's, recorded by the server that
	// writes its outcome); zero: now.
	Started time.Time
	// Traceparent and Tracestate are the task's stored trace context,
	// the span's parent; empty: the span starts a trace.
	Traceparent, Tracestate string
}

// StartRun starts the consumer span of one attempt, a child of the task's
// stored trace context, and returns ctx carrying it. With tracing off it
// returns ctx carrying the stored context, if any, so that exec programs
// and devices still receive it, and a nil span.
func StartRun(ctx context.Context, r Run) (context.Context, *Span) {
	ctx = Extract(ctx, r.Traceparent, r.Tracestate)
	t := tracer()
	if t == nil {
		return ctx, nil
	}
	attrs := []Attr{
		attribute.String("messaging.system", System),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", r.Kind),
		attribute.String("messaging.message.id", r.Key),
		attribute.String("messaging.client.id", r.WorkerID),
		attribute.Int("leasepool.attempt", r.Attempt),
	}
	if r.Wait >= 0 {
		attrs = append(attrs, attribute.Float64("leasepool.wait", r.Wait.Seconds()))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if !r.Started.IsZero() {
		opts = append(opts, trace.WithTimestamp(r.Started))
	}
	ctx, s := t.Start(ctx, "process "+r.Kind, opts...)
	return ctx, &Span{s}
}
