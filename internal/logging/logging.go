// Package logging builds Sluice's structured loggers (log/slog, text or
// JSON) and carries request-scoped fields: a request id and whatever a
// transport adds, attached to the context and written by every log call
// that is given that context (the *Context methods of slog.Logger).
//
// Sluice logs no line per allowed check unless the level is debug; denials
// reach the log as sampled audit events (package events).
package logging

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// New returns a logger writing to w in format ("text" or "json") at level
// ("debug", "info", "warn", "error"), with request-scoped fields from the
// context (see With).
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("logging: level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("logging: format %q: want text or json", format)
	}
	return slog.New(ContextHandler{Handler: h}), nil
}

type ctxKey struct{}

// With returns ctx carrying attrs as request-scoped fields, after those
// ctx already carries.
func With(ctx context.Context, attrs ...slog.Attr) context.Context {
	if len(attrs) == 0 {
		return ctx
	}
	old, _ := ctx.Value(ctxKey{}).([]slog.Attr)
	all := make([]slog.Attr, 0, len(old)+len(attrs))
	all = append(append(all, old...), attrs...)
	return context.WithValue(ctx, ctxKey{}, all)
}

// Attrs returns the request-scoped fields ctx carries.
func Attrs(ctx context.Context) []slog.Attr {
	a, _ := ctx.Value(ctxKey{}).([]slog.Attr)
	return a
}

// RequestIDKey is the key of the request id among the request-scoped
// fields, and in every log line about a request.
const RequestIDKey = "request_id"

// RequestID returns the request id ctx carries (see HTTP, and the
// gRPC interceptor of the daemon), or "" when it carries none. It allocates
// nothing.
func RequestID(ctx context.Context) string {
	for _, a := range Attrs(ctx) {
		if a.Key == RequestIDKey {
			return a.Value.String()
		}
	}
	return ""
}

// Keys of the trace and span ids in the log lines of a traced request.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// ContextHandler adds the request-scoped fields of a record's context to
// the record before handing it to Handler, and the ids of the trace and
// span the context carries (OpenTelemetry), if any.
type ContextHandler struct {
	slog.Handler
}

// Handle implements slog.Handler.
func (h ContextHandler) Handle(ctx context.Context, r slog.Record) error {
	a := Attrs(ctx)
	sc := trace.SpanContextFromContext(ctx)
	if len(a) > 0 || sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(a...)
	}
	if sc.IsValid() {
		r.AddAttrs(slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h ContextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return ContextHandler{h.Handler.WithAttrs(attrs)}
}

// WithGroup implements slog.Handler.
func (h ContextHandler) WithGroup(name string) slog.Handler {
	return ContextHandler{h.Handler.WithGroup(name)}
}

// RequestIDHeader is the header (and gRPC metadata key, lower-cased) that
// carries a request id; Sluice echoes it, and makes one when the level is
// debug and the caller sent none.
const RequestIDHeader = "X-Request-Id"

// maxRequestID bounds the request ids taken from callers.
const maxRequestID = 128

func newRequestID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CallerRequestID returns the request id to use for one a caller sent:
// id cut to 128 bytes, or a new random one when id is empty.
func CallerRequestID(id string) string {
	if len(id) > maxRequestID {
		id = id[:maxRequestID]
	}
	if id == "" {
		id = newRequestID()
	}
	return id
}

// HTTP wraps next so that each request's context carries its request id
// (from the X-Request-Id header, echoed in the response) and, at debug
// level, one line per request is logged with its method, path, status and
// duration. Below debug it adds nothing but the header's id, and costs
// nothing when there is none.
func HTTP(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		debug := log.Enabled(r.Context(), slog.LevelDebug)
		if id == "" && !debug {
			next.ServeHTTP(w, r)
			return
		}
		id = CallerRequestID(id)
		w.Header().Set(RequestIDHeader, id)
		ctx := With(r.Context(), slog.String(RequestIDKey, id))
		r = r.WithContext(ctx)
		if !debug {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		log.LogAttrs(ctx, slog.LevelDebug, "http request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status), slog.Duration("duration", time.Since(start)),
			slog.String("remote", r.RemoteAddr))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
