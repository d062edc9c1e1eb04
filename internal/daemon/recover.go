package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recoverHTTP answers a request whose handler panicked with a 500 in the
// JSON error format and logs the panic with its stack. Without it
// net/http drops the connection without an answer. It costs a request a
// deferred call, no allocation.
func recoverHTTP(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p) // a deliberate abort, which net/http handles
			}
			log.LogAttrs(r.Context(), slog.LevelError, "panic serving a request",
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal_error",
				"error_description": "internal error"})
		}()
		next.ServeHTTP(w, r)
	})
}

// recoverUnary wraps the interceptor next so that a call whose handler
// panicked is answered with Internal and the panic logged with its stack.
// Without it the panic ends the process: grpc-go recovers none. It wraps
// next rather than being chained after it, which would cost every call
// an allocation; it costs a call a deferred call.
func recoverUnary(log *slog.Logger, next grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.LogAttrs(ctx, slog.LevelError, "panic serving a gRPC call",
					slog.String("method", info.FullMethod),
					slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		return next(ctx, req, info, handler)
	}
}
