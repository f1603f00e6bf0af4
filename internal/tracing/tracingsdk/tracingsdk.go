// Package tracingsdk starts the OpenTelemetry SDK from the standard
// OTEL_* variables, for programs: leasepool's own command, and tests.
// Libraries never import it (package tracing makes the spans, through
// whatever provider the program installed).
package tracingsdk

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Setup starts the OpenTelemetry SDK when the environment asks for an
// exporter: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// or OTEL_TRACES_EXPORTER=otlp. It exports over OTLP/HTTP (protobuf) as the
// OTEL_EXPORTER_OTLP_* variables say, samples as OTEL_TRACES_SAMPLER says,
// names the service OTEL_SERVICE_NAME (default: leasepool) and installs
// the provider and the W3C trace context propagator globally.
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none leave it off. With
// nothing set it does nothing and returns a shutdown that does nothing.
// Shutdown flushes the spans not yet exported.
func Setup(ctx context.Context) (shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return off, nil
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return off, nil
	case "":
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return off, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp or none)", exp)
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := os.Getenv(name); v != "" {
			if v != "http/protobuf" {
				return nil, fmt.Errorf("%s: %q is not supported (http/protobuf)", name, v)
			}
			break
		}
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	tp, err := NewProvider(ctx, exporter)
	if err != nil {
		return nil, err
	}
	// Export failures (a collector away) are logged, not printed by
	// OpenTelemetry's own logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		slog.Warn("tracing: spans not exported", slog.Any("err", err))
	}))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

// NewProvider is the provider Setup installs, exporting to exporter in
// batches (OTEL_BSP_* variables), with the sampler and resource of the
// environment. Tests use it with an exporter of their own.
func NewProvider(ctx context.Context, exporter sdktrace.SpanExporter) (*sdktrace.TracerProvider, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "leasepool")),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res)), nil
}
