// Package grpcapi serves Sluice's own gRPC API, sluice.v1.RateLimiter
// (proto/sluice/v1/sluice.proto), on top of the engine and the
// reservations of capacity. Errors become gRPC codes in one table (see
// errorCodes), with the HTTP API's error code as the reason of an
// ErrorInfo detail and, for bad input, a BadRequest detail naming the
// field; bad input is refused with InvalidArgument before the engine is
// called.
package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/grpccodec"
	"github.com/sluicehq/sluice/internal/reserve"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/reservation"
)

// Engine is what the service needs of the engine. *engine.Engine
// implements it. Implementations must be safe for concurrent use.
type Engine interface {
	Check(ctx context.Context, c *engine.Check) (engine.Result, error)
	// BatchCheckInto writes the results of checks into a, which the
	// service reuses from batch to batch (see engine.BatchAnswer).
	BatchCheckInto(ctx context.Context, checks []engine.Check, mode engine.BatchMode, a *engine.BatchAnswer) error
	// Begin begins a batch of n checks, to be decided into a: a large one
	// waits its turn (engine.Engine.Begin).
	Begin(ctx context.Context, n int, a *engine.BatchAnswer)
	Status(ctx context.Context, c *engine.Check) ([]engine.RuleResult, error)
	Reset(ctx context.Context, c *engine.Check) error
}

// Limits on the input, the same as the HTTP API's.
const (
	// MaxIdentifierBytes is the longest identifier accepted.
	MaxIdentifierBytes = engine.MaxIdentifierLen
	// MaxResourceBytes is the longest resource accepted.
	MaxResourceBytes = engine.MaxResourceLen
	// MaxCost is the largest cost one check may ask for.
	MaxCost = engine.MaxCost
	// MaxBatch is the most checks one batch may hold.
	MaxBatch = engine.MaxBatch
)

// Config configures the service.
type Config struct {
	// Engine decides the checks. Required.
	Engine Engine
	// Now is the clock used for reset_at; nil means time.Now.
	Now func() time.Time
	// AuthorizeReset decides whether the caller may call ResetLimit, an
	// operator's tool: nil, or a gRPC status error (Unauthenticated,
	// PermissionDenied). Nil refuses every ResetLimit.
	AuthorizeReset func(ctx context.Context) error
	// Reservations serves Reserve, GetReservation, ReleaseReservation and
	// the reservation_id of checks; nil answers them FailedPrecondition.
	Reservations Reservations
}

// Server implements sluicev1.RateLimiterServer. It is safe for concurrent
// use.
type Server struct {
	sluicev1.UnimplementedRateLimiterServer
	eng   Engine
	now   func() time.Time
	reset func(ctx context.Context) error
	resv  Reservations // nil when reservations are off
}

// New returns the service for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("grpcapi: Config.Engine is required")
	}
	s := &Server{eng: cfg.Engine, now: cfg.Now, reset: cfg.AuthorizeReset, resv: cfg.Reservations}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Register registers s on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { sluicev1.RegisterRateLimiterServer(g, s) }

// errorCodes maps errors to gRPC codes, in one table; the first entry the
// error matches with errors.Is wins. Anything else is Internal. reason is
// the HTTP API's error code for the same error, sent as the reason of an
// ErrorInfo detail (domain "sluice").
var errorCodes = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{engine.ErrInvalidCheck, codes.InvalidArgument, "invalid_request"},
	{sluice.ErrInvalidCost, codes.InvalidArgument, "invalid_request"},
	{sluice.ErrStoreUnavailable, codes.Unavailable, "unavailable"},
	{context.DeadlineExceeded, codes.DeadlineExceeded, "unavailable"},
	{context.Canceled, codes.Canceled, "unavailable"},
	{reservation.ErrInvalid, codes.InvalidArgument, "invalid_request"},
	{reservation.ErrQueueFull, codes.ResourceExhausted, "queue_full"},
	{reservation.ErrNotFound, codes.NotFound, "reservation_not_found"},
	{reserve.ErrForbidden, codes.PermissionDenied, "forbidden"},
	{reserve.ErrDenyListed, codes.PermissionDenied, "forbidden"},
	{errReservationsOff, codes.FailedPrecondition, "reservations_disabled"},
}

// ErrorDomain is the domain of the ErrorInfo details of Sluice's errors.
const ErrorDomain = "sluice"

// toStatus returns err as a gRPC status error: its code from errorCodes,
// an ErrorInfo detail with the reason, and for a field error a BadRequest
// detail naming the field.
func toStatus(err error) error {
	for _, e := range errorCodes {
		if !errors.Is(err, e.err) {
			continue
		}
		st := status.New(e.code, err.Error())
		details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: e.reason, Domain: ErrorDomain}}
		var fe *engine.FieldError
		if errors.As(err, &fe) {
			details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: fe.Field, Description: fe.Reason},
			}})
		}
		if withDetails, derr := st.WithDetails(details...); derr == nil {
			st = withDetails
		}
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// checkUTF8 returns the error for a request that was malformed, or held invalid UTF-8 in a
// string field, as marked by grpccodec.Codec; nil otherwise.
func checkUTF8(m proto.Message) error {
	if reason, ok := grpccodec.Malformed(m); ok {
		return status.Error(codes.InvalidArgument, "malformed request: "+reason)
	}
	if field, ok := grpccodec.InvalidUTF8(m); ok {
		return toStatus(fieldErr(field, "invalid UTF-8"))
	}
	return nil
}

func fieldErr(field, format string, args ...any) error {
	return &engine.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func priority(field string, p sluicev1.Priority) (engine.Priority, error) {
	switch p {
	case sluicev1.Priority_PRIORITY_UNSPECIFIED, sluicev1.Priority_PRIORITY_NORMAL:
		return engine.PriorityNormal, nil
	case sluicev1.Priority_PRIORITY_HIGH:
		return engine.PriorityHigh, nil
	case sluicev1.Priority_PRIORITY_LOW:
		return engine.PriorityLow, nil
	}
	return 0, fieldErr(field, "unknown priority %d", int32(p))
}

// identity is the part of a request that names whom and what it is about.
type identity struct {
	clientID, resource, operation, user, ip, apiKey, method string
}

// check fills c with id and validates it.
func (id *identity) check(c *engine.Check) error {
	*c = engine.Check{
		ClientID: id.clientID, Resource: id.resource, Operation: id.operation,
		User: id.user, IP: id.ip, APIKey: id.apiKey, Method: id.method,
	}
	return c.Validate()
}

// toCheck fills c from r: the cost (1 when absent) and the priority read,
// the other fields as they are, unvalidated (see engine.Check.Validate).
// Its errors name the fields of r alone; a batch adds the check's index
// with engine.InBatch.
func toCheck(r *sluicev1.CheckRequest, c *engine.Check) error {
	*c = engine.Check{
		ClientID: r.GetClientId(), Resource: r.GetResource(), Operation: r.GetOperation(),
		User: r.GetUser(), IP: r.GetIp(), APIKey: r.GetApiKey(), Method: r.GetMethod(),
	}
	cost := int64(1)
	if r.Cost != nil {
		cost = r.GetCost()
	}
	p, err := priority("priority", r.GetPriority())
	if err != nil {
		return err
	}
	c.Cost, c.Priority, c.IdempotencyKey = cost, p, r.GetIdempotencyKey()
	return nil
}

// CheckRateLimit implements sluicev1.RateLimiterServer.
func (s *Server) CheckRateLimit(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	if err := checkUTF8(req); err != nil {
		return nil, err
	}
	var c engine.Check
	if err := toCheck(req, &c); err != nil {
		return nil, toStatus(err)
	}
	if err := c.Validate(); err != nil {
		return nil, toStatus(err)
	}
	if id := req.GetReservationId(); id != "" {
		if err := engine.ValidateField("reservation_id", id); err != nil {
			return nil, toStatus(err)
		}
		resp, err := s.checkReserved(&c, id)
		if resp != nil || err != nil {
			return resp, err
		}
	}
	res, err := s.eng.Check(ctx, &c)
	if err != nil {
		return nil, toStatus(err)
	}
	if res.Unavailable {
		return nil, status.Errorf(codes.Unavailable, "the rate limit store cannot answer and rule %q fails closed", res.Deciding.Rule)
	}
	resp := s.response(&res)
	if !res.Allowed {
		s.addQueued(resp, &c)
	}
	return resp, nil
}

// BatchCheck implements sluicev1.RateLimiterServer.
func (s *Server) BatchCheck(ctx context.Context, req *sluicev1.BatchCheckRequest) (*sluicev1.BatchCheckResponse, error) {
	if err := checkUTF8(req); err != nil {
		return nil, err
	}
	var mode engine.BatchMode
	switch req.GetMode() {
	case sluicev1.BatchMode_BATCH_MODE_UNSPECIFIED, sluicev1.BatchMode_BATCH_MODE_ALL_OR_NOTHING:
		mode = engine.AllOrNothing
	case sluicev1.BatchMode_BATCH_MODE_BEST_EFFORT:
		mode = engine.BestEffort
	default:
		return nil, toStatus(fieldErr("mode", "unknown mode %d", int32(req.GetMode())))
	}
	if _, err := priority("priority", req.GetPriority()); err != nil {
		return nil, toStatus(err)
	}
	// The batch's identity fields are checked even when every check has
	// its own, so that a bad one is never silently ignored.
	for _, f := range [...]struct{ name, val string }{
		{"client_id", req.GetClientId()}, {"user", req.GetUser()}, {"ip", req.GetIp()}, {"api_key", req.GetApiKey()},
	} {
		if err := engine.ValidateField(f.name, f.val); err != nil {
			return nil, toStatus(err)
		}
	}
	m := getBatchMem(len(req.GetChecks()))
	defer putBatchMem(m)
	// A large batch is converted, decided and answered in its turn
	// (engine.Engine.Begin); gRPC decoded it before and encodes the answer
	// after.
	s.eng.Begin(ctx, len(req.GetChecks()), &m.answer)
	defer m.answer.End()
	checks := m.checks
	r := new(sluicev1.CheckRequest) // each check's, in turn
	for i, item := range req.GetChecks() {
		if item.GetReservationId() != "" {
			return nil, toStatus(engine.InBatch(i, fieldErr("reservation_id", "not accepted in a batch; use CheckRateLimit")))
		}
		*r = sluicev1.CheckRequest{
			ClientId: or(item.GetClientId(), req.GetClientId()), Resource: item.GetResource(),
			Operation: item.GetOperation(), Cost: item.Cost, Priority: item.GetPriority(),
			IdempotencyKey: item.GetIdempotencyKey(), User: or(item.GetUser(), req.GetUser()),
			Ip: or(item.GetIp(), req.GetIp()), ApiKey: or(item.GetApiKey(), req.GetApiKey()),
			Method: item.GetMethod(),
		}
		if r.Priority == sluicev1.Priority_PRIORITY_UNSPECIFIED {
			r.Priority = req.GetPriority()
		}
		if err := toCheck(r, &checks[i]); err != nil {
			return nil, toStatus(engine.InBatch(i, err))
		}
	}
	if err := engine.ValidateBatch(checks, mode); err != nil {
		return nil, toStatus(err)
	}
	if err := s.eng.BatchCheckInto(ctx, checks, mode, &m.answer); err != nil {
		return nil, toStatus(err)
	}
	results := m.answer.Results
	resp := &sluicev1.BatchCheckResponse{Allowed: true, Results: make([]*sluicev1.CheckResponse, len(results))}
	allowed := 0
	for i := range results {
		resp.Results[i] = s.response(&results[i])
		if results[i].Allowed {
			allowed++
		}
	}
	resp.Allowed = allowed == len(results)
	resp.Partial = allowed > 0 && allowed < len(results)
	return resp, nil
}

// batchMem is the memory of one batch request, pooled: its checks and the
// engine's answer, each as large as the batch (about 400 KB for 1,000
// checks), which would otherwise be garbage after each batch and cause
// garbage collections that slow every other request of the process. The
// response is built anew: gRPC encodes it after the call returns.
type batchMem struct {
	checks []engine.Check
	answer engine.BatchAnswer
}

var batchPool = sync.Pool{New: func() any { return new(batchMem) }}

// getBatchMem returns pooled memory for a batch of n checks, m.checks of
// length n, all zero.
func getBatchMem(n int) *batchMem {
	m := batchPool.Get().(*batchMem)
	if cap(m.checks) < n {
		m.checks = make([]engine.Check, n)
	}
	m.checks = m.checks[:n]
	return m
}

// putBatchMem pools m, cleared, unless it grew beyond a batch of MaxBatch
// checks: the checks of a larger batch are read before it is refused.
func putBatchMem(m *batchMem) {
	results, rules := m.answer.Size()
	if cap(m.checks) > engine.MaxBatch || results > engine.MaxBatch || rules > 8*engine.MaxBatch {
		return
	}
	clear(m.checks[:cap(m.checks)])
	batchPool.Put(m)
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// GetRemainingQuota implements sluicev1.RateLimiterServer.
func (s *Server) GetRemainingQuota(ctx context.Context, req *sluicev1.QuotaRequest) (*sluicev1.QuotaResponse, error) {
	if err := checkUTF8(req); err != nil {
		return nil, err
	}
	id := identity{req.GetClientId(), req.GetResource(), req.GetOperation(), req.GetUser(), req.GetIp(), req.GetApiKey(), req.GetMethod()}
	var c engine.Check
	if err := id.check(&c); err != nil {
		return nil, toStatus(err)
	}
	rules, err := s.eng.Status(ctx, &c)
	if err != nil {
		return nil, toStatus(err)
	}
	now := s.now()
	resp := &sluicev1.QuotaResponse{ClientId: c.ClientID, Rules: make([]*sluicev1.RuleStatus, len(rules))}
	for i := range rules {
		resp.Rules[i] = ruleStatus(&rules[i], now)
	}
	return resp, nil
}

// ResetLimit implements sluicev1.RateLimiterServer.
func (s *Server) ResetLimit(ctx context.Context, req *sluicev1.ResetRequest) (*sluicev1.ResetResponse, error) {
	if err := checkUTF8(req); err != nil {
		return nil, err
	}
	id := identity{req.GetClientId(), req.GetResource(), req.GetOperation(), req.GetUser(), req.GetIp(), req.GetApiKey(), req.GetMethod()}
	var c engine.Check
	if err := id.check(&c); err != nil {
		return nil, toStatus(err)
	}
	if s.reset == nil {
		return nil, status.Error(codes.PermissionDenied, "sluice: ResetLimit is an operator's tool: it needs the control plane (--data-dir or --config-store) and a token of role operator or admin (see docs/operations.md)")
	}
	if err := s.reset(ctx); err != nil {
		return nil, err
	}
	if err := s.eng.Reset(ctx, &c); err != nil {
		return nil, toStatus(err)
	}
	return &sluicev1.ResetResponse{}, nil
}

func (s *Server) response(res *engine.Result) *sluicev1.CheckResponse {
	now := s.now()
	d := &res.Deciding
	retry := d.RetryAfter
	if res.Allowed {
		retry = 0
	}
	resp := &sluicev1.CheckResponse{
		Allowed:        res.Allowed,
		Limit:          d.Limit,
		Remaining:      d.Remaining,
		ResetAt:        resetAt(now, d.ResetAfter),
		RetryAfter:     ceilDiv(retry, time.Second),
		RetryAfterMs:   ceilDiv(retry, time.Millisecond),
		Rule:           d.Rule,
		Tier:           res.CallerTier(),
		Source:         res.Source.String(),
		FallbackReason: res.Fallback.String(),
		Cost:           d.Cost,
		ShadowDenied:   res.ShadowDenied,
		State:          state(res.Allowed, d.Limit, d.Remaining),
		CurrentCount:   max(d.Limit-d.Remaining, 0),
		Rules:          make([]*sluicev1.RuleStatus, len(res.Rules)),
	}
	for i := range res.Rules {
		resp.Rules[i] = ruleStatus(&res.Rules[i], now)
	}
	if g, ok := res.GlobalRemaining(); ok {
		resp.GlobalRemaining = &g
	}
	switch {
	case res.Allowed:
	case res.Unavailable:
		resp.Reason = "unavailable"
	case d.Global:
		resp.Reason = "global_limit_exceeded"
	default:
		resp.Reason = "rate_limit_exceeded"
	}
	return resp
}

func ruleStatus(r *engine.RuleResult, now time.Time) *sluicev1.RuleStatus {
	return &sluicev1.RuleStatus{
		Rule: r.Rule, Tier: r.Tier, Allowed: r.Allowed, Shadow: r.Shadow,
		Limit: r.Limit, Remaining: r.Remaining, ResetAt: resetAt(now, r.ResetAfter),
		RetryAfterMs: ceilDiv(r.RetryAfter, time.Millisecond), Cost: r.Cost, Source: r.Source.String(),
		FallbackReason: r.Fallback.String(), Global: r.Global,
	}
}

// state returns the usage state: throttled when denied, warning above 80%
// of the limit used, normal otherwise.
func state(allowed bool, limit, remaining int64) sluicev1.State {
	switch {
	case !allowed:
		return sluicev1.State_STATE_THROTTLED
	case limit > 0 && (limit-remaining)*5 > limit*4:
		return sluicev1.State_STATE_WARNING
	}
	return sluicev1.State_STATE_NORMAL
}

func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}

func resetAt(now time.Time, d time.Duration) int64 {
	t := now.Add(d)
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}
