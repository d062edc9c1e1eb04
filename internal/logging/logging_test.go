package logging

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestNew(t *testing.T) {
	var b bytes.Buffer
	log, err := New(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.WarnContext(With(context.Background(), slog.String("request_id", "r1")), "shown", "k", 1)
	if got := b.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `"request_id":"r1"`) || !strings.Contains(got, `"msg":"shown"`) {
		t.Errorf("log = %s", got)
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := New(&b, bad[0], bad[1]); err == nil {
			t.Errorf("New(%q, %q): no error", bad[0], bad[1])
		}
	}
}

func TestHTTPMiddleware(t *testing.T) {
	var b bytes.Buffer
	var seen []slog.Attr
	h := func(w http.ResponseWriter, r *http.Request) {
		seen = Attrs(r.Context())
		w.WriteHeader(http.StatusTeapot)
	}
	for _, tt := range []struct {
		level  string
		header string
		lines  int
		id     bool
	}{
		{"info", "", 0, false},   // nothing added, nothing logged
		{"info", "abc", 0, true}, // the caller's id is carried and echoed
		{"debug", "", 1, true},   // an id is made; one line per request
	} {
		b.Reset()
		seen = nil
		log, _ := New(&b, "text", tt.level)
		req := httptest.NewRequest("POST", "/api/v1/check", nil)
		if tt.header != "" {
			req.Header.Set(RequestIDHeader, tt.header)
		}
		rec := httptest.NewRecorder()
		HTTP(log, http.HandlerFunc(h)).ServeHTTP(rec, req)
		if got := strings.Count(b.String(), "\n"); got != tt.lines {
			t.Errorf("%s %q: %d lines, want %d: %s", tt.level, tt.header, got, tt.lines, b.String())
		}
		if got := rec.Header().Get(RequestIDHeader) != ""; got != tt.id || (len(seen) > 0) != tt.id {
			t.Errorf("%s %q: id echoed %v, in context %v, want %v", tt.level, tt.header, got, seen, tt.id)
		}
		if tt.header != "" && rec.Header().Get(RequestIDHeader) != tt.header {
			t.Errorf("echoed %q, want %q", rec.Header().Get(RequestIDHeader), tt.header)
		}
		if tt.lines > 0 && !strings.Contains(b.String(), "status=418") {
			t.Errorf("debug line lacks the status: %s", b.String())
		}
	}
}

// RequestID finds the request id among the request-scoped fields, without
// allocating (the denial events read it on the check's path).
func TestRequestID(t *testing.T) {
	ctx := With(context.Background(), slog.String("tenant", "t1"))
	if got := RequestID(ctx); got != "" {
		t.Errorf("RequestID without one = %q, want empty", got)
	}
	ctx = With(ctx, slog.String(RequestIDKey, "r9"))
	if got := RequestID(ctx); got != "r9" {
		t.Errorf("RequestID = %q, want r9", got)
	}
	if n := testing.AllocsPerRun(100, func() { RequestID(ctx) }); n != 0 {
		t.Errorf("RequestID allocates %v times, want 0", n)
	}
}

func TestTraceIDs(t *testing.T) {
	var b bytes.Buffer
	log, err := New(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xab}, SpanID: trace.SpanID{0xcd}})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "traced")
	log.InfoContext(context.Background(), "untraced")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log = %s", b.String())
	}
	if want := `"trace_id":"ab000000000000000000000000000000","span_id":"cd00000000000000"`; !strings.Contains(lines[0], want) {
		t.Errorf("traced line = %s, want %s", lines[0], want)
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("untraced line = %s, want no trace_id", lines[1])
	}
}
