package daemon_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/logging"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// A check over HTTP with a traceparent header continues the caller's
// trace: its span and its store call's are in it, and the request's log
// line carries the trace id.
func TestTraceHTTPCheck(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	var buf lockedBuffer
	log, err := logging.New(&buf, "json", "debug")
	if err != nil {
		t.Fatal(err)
	}
	td := start(t, policyText(), func(c *daemon.Config) { c.Tracing, c.Logger = tp, log })

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("POST", td.base+"/api/v1/check", strings.NewReader(`{"client_id":"t1","resource":"/api/limited"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r := read(t, resp); r.status != 200 {
		t.Fatalf("check: %d %s", r.status, r.raw)
	}

	var check, st *tracetest.SpanStub
	spans := exp.GetSpans()
	for i := range spans {
		switch spans[i].Name {
		case "sluice.check":
			check = &spans[i]
		case "sluice.store":
			st = &spans[i]
		}
	}
	if check == nil || st == nil {
		t.Fatalf("spans %v, want sluice.check and sluice.store", spans)
	}
	if got := check.SpanContext.TraceID().String(); got != traceID || check.Parent.SpanID().String() != parentID {
		t.Errorf("check span in trace %s under %s, want %s under %s", got, check.Parent.SpanID(), traceID, parentID)
	}
	if st.Parent.SpanID() != check.SpanContext.SpanID() || st.SpanContext.TraceID() != check.SpanContext.TraceID() {
		t.Errorf("store span under %s, want under the check's %s", st.Parent.SpanID(), check.SpanContext.SpanID())
	}
	attrs := map[string]string{}
	for _, a := range check.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	for _, k := range []string{"sluice.rule", "sluice.allowed", "sluice.source"} {
		if attrs[k] == "" {
			t.Errorf("check span has no %s: %v", k, attrs)
		}
	}
	if attrs["sluice.allowed"] != "true" {
		t.Errorf("sluice.allowed = %q, want true", attrs["sluice.allowed"])
	}

	// The request's log line is written once the answer is sent.
	want := `"trace_id":"` + traceID + `"`
	for deadline := time.Now().Add(2 * time.Second); !strings.Contains(buf.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %s:\n%s", want, buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Without a traceparent and at ratio 0, no check is traced, and a caller's
// unsampled trace is followed.
func TestTraceUnsampled(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	td := start(t, policyText(), func(c *daemon.Config) { c.Tracing = tp })
	td.check(t, `{"client_id":"t2","resource":"/api/limited"}`)
	req, _ := http.NewRequest("POST", td.base+"/api/v1/check", strings.NewReader(`{"client_id":"t2","resource":"/api/limited"}`))
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	read(t, resp)
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Errorf("exported %d spans, want none", len(spans))
	}
}

// A gRPC check with traceparent metadata continues the caller's trace.
func TestTraceGRPCCheck(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	td := start(t, policyText(), func(c *daemon.Config) { c.Tracing = tp })
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	md := metadata.Pairs("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	if _, err := c.CheckRateLimit(metadata.NewOutgoingContext(ctx(t), md), &sluicev1.CheckRequest{ClientId: "g", Resource: "/api/limited"}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
		if s.SpanContext.TraceID().String() != traceID {
			t.Errorf("span %s in trace %s, want %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
	}
	if len(names) != 2 {
		t.Errorf("spans %v, want sluice.store and sluice.check", names)
	}
}

// processCPU returns the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHTTPCheckTraced is BenchmarkHTTPCheck with tracing off and at
// 1% sampling (spans exported to nowhere through the batch processor of
// an OTLP exporter), callers sending no trace context.
func BenchmarkHTTPCheckTraced(b *testing.B) {
	for _, bc := range []struct {
		name  string
		ratio float64 // < 0: off
	}{{"off", -1}, {"ratio=0.01", 0.01}} {
		b.Run(bc.name, func(b *testing.B) {
			td := start(b, benchPolicy, realClock, func(c *daemon.Config) {
				if bc.ratio >= 0 {
					tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
						sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
					b.Cleanup(func() { tp.Shutdown(context.Background()) })
					c.Tracing, c.TraceSampleRatio = tp, bc.ratio
				}
			})
			tr := &http.Transport{MaxIdleConnsPerHost: 128}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			var n atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					body := `{"client_id":"k` + strconv.Itoa(int(n.Add(1)%1000)) + `","resource":"/api/x"}`
					resp, err := client.Post(td.base+"/api/v1/check", "application/json", strings.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatal(resp.Status)
					}
				}
			})
			// The CPU time of client and server, steadier than ns/op on a
			// machine others share.
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
