package tracingsdk

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/leasepool/leasepool/internal/tracing"
)

// Unset, or turned off, Setup starts nothing; a setting it cannot honour
// is refused naming the variable.
func TestSetupOffAndRefused(t *testing.T) {
	for _, env := range [][2]string{{"", ""}, {"OTEL_SDK_DISABLED", "true"}, {"OTEL_TRACES_EXPORTER", "none"}} {
		if env[0] != "" {
			t.Setenv(env[0], env[1])
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		}
		if _, err := Setup(context.Background()); err != nil || tracing.On() {
			t.Fatalf("with %s=%s: Setup %v, on %v; want off", env[0], env[1], err, tracing.On())
		}
	}
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	for _, env := range [][2]string{{"OTEL_TRACES_EXPORTER", "console"}, {"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}} {
		t.Run(env[0], func(t *testing.T) {
			t.Setenv(env[0], env[1])
			if _, err := Setup(context.Background()); err == nil || !strings.HasPrefix(err.Error(), env[0]+": ") {
				t.Fatalf("Setup with %s=%s: %v; want an error naming it", env[0], env[1], err)
			}
		})
	}
}

// With an endpoint, spans go to it over OTLP/HTTP, flushed by shutdown.
// (Last: it installs the global provider.)
func TestSetupExports(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			posts.Add(1)
		}
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL) // the base: /v1/traces is added
	shutdown, err := Setup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.On() {
		t.Fatal("tracing is off after Setup with an endpoint")
	}
	_, span := tracing.StartPublish(context.Background(), "k", "key")
	span.End(nil)
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("no export reached the endpoint")
	}
}

// OTEL_TRACES_SAMPLER is the SDK's: always_off records nothing, and the
// context handed on says so (flags 00), so workers record nothing of it
// either.
func TestSetupSampler(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/v1/traces")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	shutdown, err := Setup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	ctx, span := tracing.StartPublish(context.Background(), "k", "key")
	defer span.End(nil)
	if tp, _ := tracing.Inject(ctx); !strings.HasSuffix(tp, "-00") {
		t.Fatalf("traceparent %q under always_off; want flags 00", tp)
	}
}
