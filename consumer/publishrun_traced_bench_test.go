package consumer_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/leasepool/leasepool/internal/tracing/tracingsdk"
)

// BenchmarkPublishRunTraced is BenchmarkPublishRun with tracing on: the
// SDK batching every span (a publish and an attempt per task) to an
// exporter that keeps them in memory, so what shows is the spans' cost
// in the process, not a collector's. It installs the global provider:
// run it alone (-bench 'Traced$').
func BenchmarkPublishRunTraced(b *testing.B) {
	exp := tracetest.NewInMemoryExporter()
	tp, err := tracingsdk.NewProvider(context.Background(), exp)
	if err != nil {
		b.Fatal(err)
	}
	otel.SetTracerProvider(tp)
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	// The publisher's own span: every task continues its trace.
	ctx, span := tp.Tracer("bench").Start(context.Background(), "caller")
	defer span.End()
	benchPublishRun(b, ctx)
	if err := tp.ForceFlush(context.Background()); err != nil {
		b.Fatal(err)
	}
	// The batcher drops what its queue cannot hold (2,048 by default,
	// OTEL_BSP_MAX_QUEUE_SIZE) rather than slow the work: at this pace
	// some of the two spans a task makes are dropped.
	n := len(exp.GetSpans())
	if n == 0 {
		b.Fatal("no span exported")
	}
	b.ReportMetric(float64(n)/float64(b.N), "spans/task")
	exp.Reset()
}
