package daemon

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/logging"
)

// logUnary does for gRPC what logging.HTTP does for HTTP: the request id
// from the x-request-id metadata, and at debug level one line per call
// with its method, code and duration. Calls that fail with an Internal or
// Unknown code are logged at error level whatever the level.
func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		debug := log.Enabled(ctx, slog.LevelDebug)
		var id string
		if v := metadata.ValueFromIncomingContext(ctx, "x-request-id"); len(v) > 0 {
			id = v[0]
		}
		if id == "" && !debug {
			resp, err := handler(ctx, req)
			if err != nil {
				logInternal(ctx, log, info.FullMethod, err)
			}
			return resp, err
		}
		ctx = logging.With(ctx, slog.String(logging.RequestIDKey, logging.CallerRequestID(id)))
		start := time.Now()
		resp, err := handler(ctx, req)
		if err != nil {
			logInternal(ctx, log, info.FullMethod, err)
		}
		if debug {
			log.LogAttrs(ctx, slog.LevelDebug, "grpc call", slog.String("method", info.FullMethod),
				slog.String("code", status.Code(err).String()), slog.Duration("duration", time.Since(start)))
		}
		return resp, err
	}
}

func logInternal(ctx context.Context, log *slog.Logger, method string, err error) {
	switch status.Code(err) {
	case codes.Internal, codes.Unknown:
		log.LogAttrs(ctx, slog.LevelError, "grpc call failed", slog.String("method", method), slog.String("err", err.Error()))
	}
}
