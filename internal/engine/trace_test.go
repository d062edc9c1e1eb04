package engine

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/policy"
)

// newTraced returns an engine on observePolicy tracing with a provider
// of sampler that exports to exp, synchronously.
func newTraced(tb testing.TB, sampler sdktrace.Sampler, exp sdktrace.SpanExporter) *Engine {
	tb.Helper()
	p, err := policy.Parse("test.yaml", []byte(observePolicy))
	if err != nil {
		tb.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSyncer(exp))
	tb.Cleanup(func() { tp.Shutdown(context.Background()) })
	e, err := New(Config{Store: newStore(tb), Local: newStore(tb), Policy: p, Now: func() time.Time { return t0 },
		Tracer: tp.Tracer("sluice")})
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
	e := newTraced(t, sdktrace.ParentBased(sdktrace.NeverSample()), exp)
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

func TestUnsampledCheckHasNoStoreSpan(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	exp := tracetest.NewInMemoryExporter()
	e := newTraced(t, sdktrace.NeverSample(), exp)
	mustCheck(t, e, Check{ClientID: "c", User: "u", Resource: "/api/x", Cost: 1})
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("an unsampled check exported %d spans, want 0", n)
	}
}

// BenchmarkCheckTraced is BenchmarkCheck with tracing off and at 1%
// sampling, exporting to nowhere through the batch processor a daemon
// uses: the difference is what tracing costs per check.
func BenchmarkCheckTraced(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	for _, bc := range []struct {
		name  string
		ratio float64 // < 0: no tracer
	}{{"off", -1}, {"ratio=0.01", 0.01}} {
		b.Run(bc.name, func(b *testing.B) {
			e := newBenchEngine(b)
			if bc.ratio >= 0 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(bc.ratio))),
					sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { tp.Shutdown(context.Background()) })
				e.tracer = tp.Tracer("sluice")
				e.store = traceStore(e.store, e.tracer)
			}
			ctx := context.Background()
			c := &Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Check(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
