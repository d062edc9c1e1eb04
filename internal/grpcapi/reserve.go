package grpcapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/reservation"
)

// Reservations is what the service needs of the reservations of capacity.
// *reserve.Keeper implements it. Implementations must be safe for
// concurrent use.
type Reservations interface {
	Reserve(a reserve.Ask) (reserve.Result, error)
	Get(client, id string) (reserve.Status, error)
	Release(client, id string) (reserve.Ended, error)
	Use(q *policy.Request, id string, n int64) (reserve.Status, error)
	Queued(client, resource string) (position int64, at time.Time, ok bool)
}

// errReservationsOff refuses the reservation RPCs, and a check carrying a
// reservation_id, on a server that serves no reservations.
var errReservationsOff = errors.New("sluice: this server serves no reservations (they are served on the memory store, unless turned off; see docs/api.md)")

// MaxReserveSeconds is the longest reservation, in seconds.
const MaxReserveSeconds = reservation.MaxDuration / 1_000_000

// toAsk validates r and returns the Keeper's request. Its errors are
// *engine.FieldError naming the field as in the message. Whether
// tokens_needed fits the pool is the Keeper's to say.
func toAsk(r *sluicev1.ReserveRequest) (reserve.Ask, error) {
	for _, f := range [...]struct{ name, val string }{{"client_id", r.GetClientId()}, {"resource", r.GetResource()}} {
		if err := engine.ValidateField(f.name, f.val); err != nil {
			return reserve.Ask{}, err
		}
	}
	var p reservation.Priority
	switch r.GetPriority() {
	case sluicev1.Priority_PRIORITY_UNSPECIFIED, sluicev1.Priority_PRIORITY_NORMAL:
		p = reservation.Normal
	case sluicev1.Priority_PRIORITY_HIGH:
		p = reservation.High
	case sluicev1.Priority_PRIORITY_LOW:
		p = reservation.Low
	default:
		return reserve.Ask{}, fieldErr("priority", "unknown priority %d", int32(r.GetPriority()))
	}
	tokens, secs := r.GetTokensNeeded(), r.GetDurationSeconds()
	switch {
	case r.GetClientId() == "":
		return reserve.Ask{}, fieldErr("client_id", "required")
	case tokens <= 0:
		return reserve.Ask{}, fieldErr("tokens_needed", "must be positive, got %d", tokens)
	case secs <= 0 || secs > MaxReserveSeconds:
		return reserve.Ask{}, fieldErr("duration_seconds", "must be 1 to %d, got %d", MaxReserveSeconds, secs)
	}
	return reserve.Ask{Client: r.GetClientId(), Resource: r.GetResource(), Tokens: tokens,
		Duration: time.Duration(secs) * time.Second, Priority: p}, nil
}

// reserveErr turns the Keeper's refusal of a bad request into a field
// error named as in the messages; other errors are returned as they are.
func reserveErr(err error) error {
	if field, reason, ok := reserve.InvalidField(err); ok {
		return fieldErr(field, "%s", reason)
	}
	return err
}

// reservationRef validates the reservation_id and client_id of a request
// naming a reservation.
func reservationRef(id, client string) error {
	if id == "" {
		return fieldErr("reservation_id", "required")
	}
	if err := engine.ValidateField("reservation_id", id); err != nil {
		return err
	}
	return engine.ValidateField("client_id", client)
}

func stamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// Reserve implements sluicev1.RateLimiterServer.
func (s *Server) Reserve(ctx context.Context, req *sluicev1.ReserveRequest) (*sluicev1.ReserveResponse, error) {
	if err := checkUTF8(req); err != nil {
		return nil, err
	}
	a, err := toAsk(req)
	if err != nil {
		return nil, toStatus(err)
	}
	if s.resv == nil {
		return nil, toStatus(errReservationsOff)
	}
	res, err := s.resv.Reserve(a)
	if err != nil {
		return nil, toStatus(reserveErr(err))
	}
	resp := &sluicev1.ReserveResponse{ReservationId: res.ID, TokensNeeded: res.Tokens, PositionInQueue: res.Position}
	if res.Granted {
		resp.Status = sluicev1.ReservationStatus_RESERVATION_STATUS_GRANTED
		resp.TokensReserved, resp.ExpiresAt, resp.PositionInQueue = res.Tokens, stamp(res.ExpiresAt), 0
	} else {
		resp.Status = sluicev1.ReservationStatus_RESERVATION_STATUS_QUEUED
		resp.EstimatedGrantAt = stamp(res.EstimatedAt)
	}
	return resp, nil
}

// checkRef checks a request req naming the reservation id of client, and
// that reservations are on; its error is a status.
func (s *Server) checkRef(req proto.Message, id, client string) error {
	if err := checkUTF8(req); err != nil {
		return err
	}
	if err := reservationRef(id, client); err != nil {
		return toStatus(err)
	}
	if s.resv == nil {
		return toStatus(errReservationsOff)
	}
	return nil
}

// GetReservation implements sluicev1.RateLimiterServer.
func (s *Server) GetReservation(ctx context.Context, req *sluicev1.GetReservationRequest) (*sluicev1.Reservation, error) {
	if err := s.checkRef(req, req.GetReservationId(), req.GetClientId()); err != nil {
		return nil, err
	}
	st, err := s.resv.Get(req.GetClientId(), req.GetReservationId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &sluicev1.Reservation{
		ReservationId: st.ID, ClientId: st.Client, Resource: st.Resource, Rule: st.Rule,
		TokensReserved: st.Tokens, TokensRemaining: st.Balance, TokensUsed: st.Used,
	}
	if st.State == "granted" {
		resp.Status = sluicev1.ReservationStatus_RESERVATION_STATUS_GRANTED
		resp.GrantedAt, resp.ExpiresAt = stamp(st.GrantedAt), stamp(st.ExpiresAt)
	} else {
		resp.Status = sluicev1.ReservationStatus_RESERVATION_STATUS_QUEUED
		resp.PositionInQueue, resp.EstimatedGrantAt = st.Position, stamp(st.EstimatedAt)
	}
	return resp, nil
}

// ReleaseReservation implements sluicev1.RateLimiterServer.
func (s *Server) ReleaseReservation(ctx context.Context, req *sluicev1.ReleaseReservationRequest) (*sluicev1.ReleaseReservationResponse, error) {
	if err := s.checkRef(req, req.GetReservationId(), req.GetClientId()); err != nil {
		return nil, err
	}
	end, err := s.resv.Release(req.GetClientId(), req.GetReservationId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &sluicev1.ReleaseReservationResponse{ReservationId: req.GetReservationId(), TokensReturned: end.Returned,
		Status: sluicev1.ReservationStatus_RESERVATION_STATUS_RELEASED}
	if end.State == "cancelled" {
		resp.Status = sluicev1.ReservationStatus_RESERVATION_STATUS_CANCELLED
	}
	return resp, nil
}

// checkReserved decides a check that carries a reservation ID: it draws
// the check's cost from the reservation, without touching the limits. It
// returns nil, nil when the reservation cannot cover the check (its
// balance is short, or it is still queued) or the caller is deny-listed:
// the limits then decide it as any other check.
func (s *Server) checkReserved(c *engine.Check, id string) (*sluicev1.CheckResponse, error) {
	if s.resv == nil {
		return nil, toStatus(errReservationsOff)
	}
	st, err := s.resv.Use(&policy.Request{ClientID: c.ClientID, User: c.User, IP: c.IP, APIKey: c.APIKey,
		Resource: c.Resource, Method: c.Method, Operation: c.Operation}, id, c.Cost)
	switch {
	case errors.Is(err, reservation.ErrInsufficient), errors.Is(err, reservation.ErrNotGranted),
		errors.Is(err, reserve.ErrDenyListed):
		return nil, nil
	case err != nil:
		return nil, toStatus(err)
	}
	return &sluicev1.CheckResponse{
		Allowed: true, Limit: st.Tokens, Remaining: st.Balance, ResetAt: st.ExpiresAt.Unix(),
		Rule: st.Rule, Source: "reservation", Cost: c.Cost, State: state(true, st.Tokens, st.Balance),
		CurrentCount: st.Tokens - st.Balance, ReservationId: id,
	}, nil
}

// addQueued sets on resp, the answer to a check refused by the limits,
// the place and the wait of the client's queued reservation for the
// check's resource, when it has one.
func (s *Server) addQueued(resp *sluicev1.CheckResponse, c *engine.Check) {
	if s.resv == nil {
		return
	}
	pos, at, ok := s.resv.Queued(c.ClientID, c.Resource)
	if !ok {
		return
	}
	wait := ceilDiv(at.Sub(s.now()), time.Millisecond)
	resp.QueuePosition, resp.EstimatedWaitMs = &pos, &wait
}
