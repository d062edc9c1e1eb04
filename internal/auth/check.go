package auth

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/control"
)

// RequireCheckToken returns next behind a check that the request carries
// any valid token, whatever its role: for the check APIs when the daemon
// is asked to require one. Answers are those of Require.
func (a *Authenticator) RequireCheckToken(next http.Handler) http.Handler {
	return a.Require(control.RoleViewer, next)
}

// UnaryInterceptor returns the gRPC interceptor that refuses a call
// without a valid token in its "authorization" metadata ("Bearer TOKEN")
// with Unauthenticated (Unavailable when the token source fails).
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		act, err := a.grpcActor(ctx)
		if err != nil {
			return nil, err
		}
		return handler(WithActor(ctx, act), req)
	}
}

// StreamInterceptor is UnaryInterceptor for streams.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if _, err := a.grpcActor(ss.Context()); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// AuthorizeGRPC returns nil when the call of ctx carries a token whose role
// is at least need: Unauthenticated without a valid token, PermissionDenied
// with a lesser role, Unavailable when the token source fails.
func (a *Authenticator) AuthorizeGRPC(ctx context.Context, need string) error {
	act, err := a.grpcActor(ctx)
	if err != nil {
		return err
	}
	if !Allows(act.Role, need) {
		return status.Errorf(codes.PermissionDenied, "sluice: this call needs a token of role %s or above; %q is %s", need, act.Name, act.Role)
	}
	return nil
}

func (a *Authenticator) grpcActor(ctx context.Context) (control.Actor, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var header string
	if v := md.Get("authorization"); len(v) > 0 {
		header = v[0]
	}
	act, err := a.Authenticate(ctx, header)
	switch {
	case err == nil:
		return act, nil
	case errors.Is(err, control.ErrUnavailable):
		return act, status.Error(codes.Unavailable, "sluice: token store unavailable")
	case errors.Is(err, ErrNoToken):
		return act, status.Error(codes.Unauthenticated, "sluice: send a token as \"authorization: Bearer TOKEN\" metadata")
	}
	return act, status.Error(codes.Unauthenticated, "sluice: invalid token")
}
