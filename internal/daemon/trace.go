// Tracing: the OpenTelemetry tracer provider of Config.OTLPEndpoint, and
// the trace context of the callers, taken from HTTP headers and gRPC
// metadata (W3C traceparent) so that a gateway's trace continues into
// the check's span.

package daemon

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// tracerName names the instrumentation of Sluice's spans.
const tracerName = "github.com/sluicehq/sluice"

// startTracing returns the tracer of the checks' spans, and the function
// that flushes and stops its provider; a nil tracer when tracing is off.
// The OTLP exporter connects lazily: a collector that is down costs
// dropped spans, not a failed start.
func startTracing(cfg *Config) (trace.Tracer, func(context.Context) error, error) {
	stop := func(context.Context) error { return nil }
	if cfg.Tracing == nil && cfg.OTLPEndpoint == "" {
		return nil, stop, nil
	}
	if r := cfg.TraceSampleRatio; !(r >= 0 && r <= 1) {
		return nil, nil, fmt.Errorf("daemon: trace sample ratio %v: want 0 to 1", r)
	}
	if cfg.Tracing != nil {
		return cfg.Tracing.Tracer(tracerName), stop, nil
	}
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: OTLP endpoint %q: %w", cfg.OTLPEndpoint, err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		// The engine samples, by TraceSampleRatio and the caller's span
		// (see engine.Config.TraceSampleRatio): the provider is asked only
		// for the spans it keeps.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "sluice"))),
	)
	return tp.Tracer(tracerName), func(ctx context.Context) error {
		// Flushing waits for the collector at most 5s more.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return tp.Shutdown(ctx)
	}, nil
}

// traceContext is the W3C trace context propagator of the callers' traces.
var traceContext propagation.TraceContext

// traceHTTP wraps next so that a request's context carries its caller's
// span (a traceparent header); next itself when tracing is off.
func traceHTTP(on bool, next http.Handler) http.Handler {
	if !on {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Traceparent") != "" {
			r = r.WithContext(traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		next.ServeHTTP(w, r)
	})
}

// traceUnary wraps next so that it is handed a context carrying the
// caller's span (traceparent metadata), as traceHTTP does for HTTP.
func traceUnary(next grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("traceparent")) > 0 {
			ctx = traceContext.Extract(ctx, metadataCarrier(md))
		}
		return next(ctx, req, info, handler)
	}
}

// metadataCarrier reads a trace context from gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
