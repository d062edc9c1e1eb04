// Package envoyrls serves Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, so that an
// Envoy configured for envoyproxy/ratelimit can use Sluice unchanged.
// Descriptors are decided by the engine against the rules of the request's
// domain (configured in envoyproxy/ratelimit's YAML format or Sluice's).
//
// Errors become gRPC codes in one table (see errorCodes); bad input is
// refused with InvalidArgument before the engine is called.
package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/grpccodec"
)

// Engine is what the service needs of the engine. *engine.Engine
// implements it. Implementations must be safe for concurrent use.
type Engine interface {
	ShouldRateLimit(ctx context.Context, domain string, descs []engine.Descriptor, hitsAddend uint64) ([]engine.DescriptorStatus, bool, error)
}

// Limits on the input.
const (
	// MaxDescriptors is the most descriptors one request may hold.
	MaxDescriptors = 64
	// MaxEntries is the most entries one descriptor may hold.
	MaxEntries = 32
	// MaxDomainBytes is the longest domain accepted.
	MaxDomainBytes = 512
	// MaxEntryBytes is the longest key or value of a descriptor entry
	// accepted (engine.MaxEntryLen, 64 KiB): above Envoy's own default
	// limit on request headers (60 KiB), which its request_headers action
	// takes a value from. A refused descriptor is an error to Envoy, which
	// lets the request through unless failure_mode_deny is set, so a
	// shorter bound would let a client that controls such a header past
	// every limit.
	MaxEntryBytes = engine.MaxEntryLen
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
	// Compat answers as envoyproxy/ratelimit where Sluice's answer
	// differs: a descriptor with no entries answers OK with no limit
	// instead of InvalidArgument, and an OVER_LIMIT descriptor reports
	// limit_remaining 0. The engine must be configured alike
	// (engine.Config.EnvoyCompat), for what is counted.
	Compat bool
}

// Server implements rlsv3.RateLimitServiceServer. It is safe for concurrent
// use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	eng Engine
	cfg Config
}

// New returns the service for eng.
func New(eng Engine, cfg Config) (*Server, error) {
	if eng == nil {
		return nil, errors.New("envoyrls: an engine is required")
	}
	return &Server{eng: eng, cfg: cfg}, nil
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

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

func checkString(what, s string, limit int) error {
	switch {
	case len(s) > limit:
		return invalid("%s is %d bytes long, the limit is %d", what, len(s), limit)
	case !utf8.ValidString(s):
		return invalid("%s is not valid UTF-8", what)
	}
	return nil
}

// Descriptors converts and validates the descriptors of req: the mapping
// from Envoy's wire types to the engine's. A descriptor with no entries is
// refused.
func Descriptors(req *rlsv3.RateLimitRequest) ([]engine.Descriptor, error) {
	return descriptors(req, false)
}

// descriptors is Descriptors; with emptyOK, a descriptor with no entries
// is kept, with no entries (the engine then needs EnvoyCompat).
func descriptors(req *rlsv3.RateLimitRequest, emptyOK bool) ([]engine.Descriptor, error) {
	if reason, ok := grpccodec.Malformed(req); ok {
		return nil, invalid("malformed request: %s", reason)
	}
	if field, ok := grpccodec.InvalidUTF8(req); ok {
		return nil, invalid("%s: invalid UTF-8", field)
	}
	if req.GetDomain() == "" {
		return nil, invalid("domain: required")
	}
	if err := checkString("domain", req.GetDomain(), MaxDomainBytes); err != nil {
		return nil, err
	}
	in := req.GetDescriptors()
	switch {
	case len(in) == 0:
		return nil, invalid("descriptors: at least one descriptor is required")
	case len(in) > MaxDescriptors:
		return nil, invalid("descriptors: %d descriptors, the limit is %d", len(in), MaxDescriptors)
	case req.GetHitsAddend() > MaxHits:
		return nil, invalid("hits_addend: %d is above the maximum %d", req.GetHitsAddend(), MaxHits)
	}
	descs := make([]engine.Descriptor, len(in))
	for i, d := range in {
		entries := d.GetEntries()
		switch {
		case len(entries) == 0 && !emptyOK:
			return nil, invalid("descriptors[%d]: at least one entry is required", i)
		case len(entries) > MaxEntries:
			return nil, invalid("descriptors[%d]: %d entries, the limit is %d", i, len(entries), MaxEntries)
		case d.GetIsNegativeHits():
			return nil, invalid("descriptors[%d]: is_negative_hits is not supported", i)
		}
		descs[i].Entries = make([]engine.DescriptorEntry, len(entries))
		for j, e := range entries {
			if e.GetKey() == "" {
				return nil, invalid("descriptors[%d].entries[%d].key: required", i, j)
			}
			// The field names are formatted only for an error: this is
			// the path of every Envoy request.
			if checkString("", e.GetKey(), MaxEntryBytes) != nil {
				return nil, checkString(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), e.GetKey(), MaxEntryBytes)
			}
			if checkString("", e.GetValue(), MaxEntryBytes) != nil {
				return nil, checkString(fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), e.GetValue(), MaxEntryBytes)
			}
			descs[i].Entries[j] = engine.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > MaxHits {
				return nil, invalid("descriptors[%d].hits_addend: %d is above the maximum %d", i, h.GetValue(), MaxHits)
			}
			// Set, it replaces the request's addend; 0 decides the
			// descriptor without charging it.
			descs[i].HitsAddend, descs[i].HitsSet = h.GetValue(), true
		}
		if o := d.GetLimit(); o != nil {
			lim, err := limitOverride(o)
			if err != nil {
				return nil, invalid("descriptors[%d].limit.%v", i, err)
			}
			descs[i].Limit = lim
		}
	}
	return descs, nil
}

// limitOverride converts a descriptor's limit override; an error starts
// with the name of the field it is about.
func limitOverride(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (engine.LimitOverride, error) {
	// The override's units are named as those of an answer (without WEEK).
	var unit time.Duration
	for _, u := range units {
		if u.unit.String() == o.GetUnit().String() {
			unit = u.d
		}
	}
	if unit == 0 {
		return engine.LimitOverride{}, fmt.Errorf("unit: %v is not a unit (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", o.GetUnit())
	}
	if o.GetRequestsPerUnit() == 0 {
		return engine.LimitOverride{}, errors.New("requests_per_unit: must be at least 1")
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = m.GetValue()
		if mult == 0 {
			return engine.LimitOverride{}, errors.New("unit_multiplier: must be at least 1")
		}
		if time.Duration(mult) > sluice.MaxWindow/unit {
			return engine.LimitOverride{}, fmt.Errorf("unit_multiplier: %d times %v is longer than %v", mult, o.GetUnit(), sluice.MaxWindow)
		}
	}
	return engine.LimitOverride{RequestsPerUnit: int64(o.GetRequestsPerUnit()), Unit: time.Duration(mult) * unit}, nil
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	descs, err := descriptors(req, s.cfg.Compat)
	if err != nil {
		return nil, toStatus(err)
	}
	statuses, over, err := s.eng.ShouldRateLimit(ctx, req.GetDomain(), descs, uint64(req.GetHitsAddend()))
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

// oneStatus is a response with one descriptor status, allocated at once.
type oneStatus struct {
	resp   rlsv3.RateLimitResponse
	st     [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status statusBlock
}

// statusBlock is a descriptor status and the messages it points to,
// allocated at once.
type statusBlock struct {
	ds    rlsv3.RateLimitResponse_DescriptorStatus
	limit rlsv3.RateLimitResponse_RateLimit
	reset durationpb.Duration
	mult  wrapperspb.UInt32Value
}

// fill makes b's status that of st, answered under cfg, and returns it.
func (b *statusBlock) fill(st *engine.DescriptorStatus, cfg Config) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &b.ds
	ds.Code = rlsv3.RateLimitResponse_OK
	if st.OverLimit {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if !st.HasLimit {
		// Unlimited descriptors report the largest remaining quota, as
		// envoyproxy/ratelimit does; unmatched ones report nothing.
		if st.Remaining > 0 {
			ds.LimitRemaining = clampU32(st.Remaining)
		}
		return ds
	}
	unit, mult := envoyUnit(st.Unit)
	b.limit.Name, b.limit.RequestsPerUnit, b.limit.Unit = st.Rule, clampU32(st.Limit), unit
	if mult > 1 {
		b.mult.Value = mult
		b.limit.UnitMultiplier = &b.mult
	}
	ds.CurrentLimit = &b.limit
	ds.LimitRemaining = clampU32(st.Remaining)
	if st.OverLimit && cfg.Compat {
		ds.LimitRemaining = 0 // as envoyproxy/ratelimit: 0 whatever remains
	}
	reset := st.DurationUntilReset
	if !cfg.PreciseReset {
		reset = wholeSeconds(reset)
	}
	ns := reset.Nanoseconds()
	b.reset.Seconds, b.reset.Nanos = ns/1e9, int32(ns%1e9)
	ds.DurationUntilReset = &b.reset
	return ds
}

// wholeSeconds returns d rounded up to whole seconds, as
// envoyproxy/ratelimit reports the time to the end of a window (the unit
// less the Unix second's remainder: the true time rounded up).
func wholeSeconds(d time.Duration) time.Duration {
	if r := d % time.Second; r > 0 {
		d += time.Second - r
	}
	return d
}

// units are Envoy's rate limit units, longest first, with the lengths
// envoyproxy/ratelimit gives them (a month is 30 days, a year 365).
var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// envoyUnit returns the Envoy unit and multiplier of a window: the longest
// unit that divides it. Windows that are not whole seconds report UNKNOWN.
func envoyUnit(d time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range units {
		if d >= u.d && d%u.d == 0 {
			n := d / u.d
			if n > 1<<32-1 {
				break
			}
			return u.unit, uint32(n)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}

func clampU32(v int64) uint32 {
	switch {
	case v < 0:
		return 0
	case v > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(v)
}
