package engine

import (
	"context"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/policy"
)

// newTraced returns an engine on observePolicy tracing at ratio with a
// provider that exports to exp, synchronously.
func newTraced(tb testing.TB, ratio float64, exp sdktrace.SpanExporter) *Engine {
	tb.Helper()
	p, err := policy.Parse("test.yaml", []byte(observePolicy))
	if err != nil {
		tb.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSyncer(exp))
	tb.Cleanup(func() { tp.Shutdown(context.Background()) })
	e, err := New(Config{Store: newStore(tb), Local: newStore(tb), Policy: p, Now: func() time.Time { return t0 },
		Tracer: tp.Tracer("sluice"), TraceSampleRatio: ratio})
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

func TestCheckSpan(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	exp := tracetest.NewInMemoryExporter()
	e := newTraced(t, 0, exp)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5},
		TraceFlags: trace.FlagsSampled, Remote: true})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	if _, err := e.Check(ctx, &Check{ClientID: "c", User: "u", Resource: "/api/x", Cost: 1, Now: t0}); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want the store's and the check's", len(spans))
	}
	st, check := spans[0], spans[1]
	if check.Name != spanCheck || check.SpanContext.TraceID() != parent.TraceID() || check.Parent.SpanID() != parent.SpanID() {
		t.Errorf("check span %s in trace %s under %s, want %s in %s under %s", check.Name, check.SpanContext.TraceID(),
			check.Parent.SpanID(), spanCheck, parent.TraceID(), parent.SpanID())
	}
	if st.Name != spanStore || st.Parent.SpanID() != check.SpanContext.SpanID() {
		t.Errorf("store span %s under %s, want %s under the check's %s", st.Name, st.Parent.SpanID(), spanStore, check.SpanContext.SpanID())
	}
	got := map[string]string{}
	for _, a := range check.Attributes {
		got[string(a.Key)] = a.Value.Emit()
	}
	for k, want := range map[string]string{"sluice.rule": "per-client", "sluice.allowed": "true", "sluice.source": "store"} {
		if got[k] != want {
			t.Errorf("check span %s = %q, want %q", k, got[k], want)
		}
	}
}

func TestTraceSampling(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	sampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}})
	for _, tt := range []struct {
		name   string
		ratio  float64
		parent trace.SpanContext
		want   int // spans
	}{
		{"no caller, ratio 0", 0, trace.SpanContext{}, 0},
		{"no caller, ratio 1", 1, trace.SpanContext{}, 2},
		{"sampled caller, ratio 0", 0, sampled, 2},
		{"unsampled caller, ratio 1", 1, unsampled, 0},
	} {
		exp := tracetest.NewInMemoryExporter()
		e := newTraced(t, tt.ratio, exp)
		ctx := trace.ContextWithRemoteSpanContext(context.Background(), tt.parent)
		if _, err := e.Check(ctx, &Check{ClientID: "c", User: "u", Resource: "/api/x", Cost: 1, Now: t0}); err != nil {
			t.Fatal(err)
		}
		// A request of resolved limits (an Envoy call) that matched none:
		// its span, and no store call.
		l := Limits{Domain: "d"}
		lctx := e.StartLimits(ctx, &l, 1)
		if err := e.DecideLimits(lctx, &l); err != nil {
			t.Fatal(err)
		}
		e.EndLimits(lctx, &l, false, nil)
		want := tt.want
		if want > 0 {
			want++ // the Envoy call's span; it matches no limit, so no store call
		}
		if got := len(exp.GetSpans()); got != want {
			t.Errorf("%s: %d spans, want %d", tt.name, got, want)
		}
	}
}

// processCPU returns the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCheckTraced is BenchmarkCheck with tracing off and at 1%
// sampling, exporting to nowhere through the batch processor a daemon
// uses: the difference is what tracing costs per check.
func BenchmarkCheckTraced(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	for _, bc := range []struct {
		name    string
		ratio   float64 // < 0: no tracer
		sampler sdktrace.Sampler
	}{
		{"off", -1, nil},
		{"ratio=0.01", 0.01, sdktrace.ParentBased(sdktrace.AlwaysSample())},
		{"ratio=1", 1, sdktrace.ParentBased(sdktrace.AlwaysSample())},
		// The SDK sampling instead of the engine: every check gets a span,
		// recorded or not.
		{"sdk-sampler=0.01", 1, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newBenchEngine(b)
			if bc.ratio >= 0 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler),
					sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { tp.Shutdown(context.Background()) })
				e.tracer, e.ratio = tp.Tracer("sluice"), bc.ratio
				e.store = traceStore(e.store, e.tracer)
			}
			ctx := context.Background()
			c := &Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU()
			for i := 0; i < b.N; i++ {
				if _, err := e.Check(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
			// The process's CPU time, the exporting goroutine's included,
			// is steadier than ns/op on a machine others share.
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
