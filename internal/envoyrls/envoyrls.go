// Package envoyrls serves Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, so that an
// Envoy configured for envoyproxy/ratelimit can use Sluice unchanged.
// Descriptors are matched against the rules of the request's domain
// (configured in envoyproxy/ratelimit's YAML format or Sluice's) here, with
// every rule of Envoy's protocol (Decider: overrides, replaces, quota_mode,
// shadow_mode, the compatibility mode), and the limits they match are
// decided by the engine like the rules of a check (engine.Limits).
//
// The package's steps are those of a check: request.go turns the wire
// request into Descriptors, plan.go matches them and plans the engine's
// items, the engine decides them, and answer.go and response.go make
// Envoy's answer.
//
// Errors become gRPC codes in one table (see errorCodes); bad input is
// refused with InvalidArgument before any limit is decided.
package envoyrls

import (
	"context"
	"errors"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
)

// Limits on the input.
const (
	// MaxDescriptors is the most descriptors one request may hold.
	MaxDescriptors = 64
	// MaxEntries is the most entries one descriptor may hold.
	MaxEntries = 32
	// MaxDomainBytes is the longest domain accepted.
	MaxDomainBytes = 512
	// MaxHits is the largest hits addend accepted.
	MaxHits = 1_000_000_000
)

// Config holds the service's knobs. The zero value answers as documented
// in docs/api.md: durations until reset in whole seconds, as
// envoyproxy/ratelimit gives them, and Sluice's own answers where the two
// differ.
type Config struct {
	// PreciseReset reports duration_until_reset to the microsecond the
	// store decided, instead of rounded up to whole seconds.
	PreciseReset bool
	// Compat decides and answers as envoyproxy/ratelimit where Sluice
	// differs (see Decider.ShouldRateLimit): descriptors decided each on
	// its own, refused hits counted on fixed windows, a descriptor with
	// no entries answered OK with no limit instead of InvalidArgument,
	// and an OVER_LIMIT descriptor reporting limit_remaining 0. Every
	// instance sharing a store should set it alike.
	Compat bool
}

// Server implements rlsv3.RateLimitServiceServer. It is safe for concurrent
// use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	dec *Decider
	cfg Config
	// answers pools the *Answer of requests of many descriptors.
	answers sync.Pool
}

// New returns the service of Envoy's descriptors decided on eng.
func New(eng *engine.Engine, cfg Config) (*Server, error) {
	if eng == nil {
		return nil, errors.New("envoyrls: an engine is required")
	}
	return &Server{dec: NewDecider(eng, cfg.Compat), cfg: cfg}, nil
}

// Register registers s on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// errInvalid is wrapped by every error about a malformed request.
var errInvalid = errors.New("envoyrls: invalid request")

// errorCodes maps errors to gRPC codes, in one table; the first entry the
// error matches with errors.Is wins. Anything else is Internal.
var errorCodes = []struct {
	err  error
	code codes.Code
}{
	{errInvalid, codes.InvalidArgument},
	{engine.ErrInvalidCheck, codes.InvalidArgument},
	{sluice.ErrInvalidCost, codes.InvalidArgument},
	{sluice.ErrStoreUnavailable, codes.Unavailable},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
}

func toStatus(err error) error {
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			return status.Error(e.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	descs, err := descriptors(req, s.cfg.Compat)
	if err != nil {
		return nil, toStatus(err)
	}
	var statuses []DescriptorStatus
	var over bool
	if len(descs) <= 4 {
		// A few statuses: allocated, as cheap as a pooled answer.
		statuses, over, err = s.dec.ShouldRateLimit(ctx, req.GetDomain(), descs, uint64(req.GetHitsAddend()))
	} else {
		a, _ := s.answers.Get().(*Answer)
		if a == nil {
			a = new(Answer)
		}
		defer s.answers.Put(a) // the statuses are read before it returns
		err = s.dec.ShouldRateLimitInto(ctx, req.GetDomain(), descs, uint64(req.GetHitsAddend()), a)
		statuses, over = a.Statuses, a.OverLimit
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if len(statuses) != len(descs) {
		return nil, status.Errorf(codes.Internal, "envoyrls: %d statuses for %d descriptors", len(statuses), len(descs))
	}
	var resp *rlsv3.RateLimitResponse
	if len(statuses) == 1 {
		// The common answer, in one allocation.
		b := new(oneStatus)
		b.st[0] = b.status.fill(&statuses[0], s.cfg)
		b.resp.Statuses = b.st[:]
		resp = &b.resp
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(statuses))}
		for i := range statuses {
			resp.Statuses[i] = new(statusBlock).fill(&statuses[i], s.cfg)
		}
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if over {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return resp, nil
}
