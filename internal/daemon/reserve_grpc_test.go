package daemon_test

import (
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/daemon"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

const reservePolicy = `version: 1
rules:
  - {id: orders, match: {resource: "/api/orders"}, limit: 5, window: 1m, algorithm: fixed_window}
  - {id: crowd, match: {resource: "/api/crowd"}, limit: 1, window: 1m, algorithm: fixed_window}
`

// errInfo returns the code, the ErrorInfo reason and the field named by
// the BadRequest detail of a gRPC error.
func errInfo(err error) (code codes.Code, reason, field string) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.BadRequest:
			if v := d.GetFieldViolations(); len(v) > 0 {
				field = v[0].GetField()
			}
		}
	}
	return st.Code(), reason, field
}

// TestGRPCReservations runs reservations through the daemon's gRPC API on
// the memory store: granted, queued, read, drawn by a check, released once,
// and refused to another client.
func TestGRPCReservations(t *testing.T) {
	td := start(t, reservePolicy)
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))

	a, err := c.Reserve(ctx(t), &sluicev1.ReserveRequest{ClientId: "a", Resource: "/api/orders", TokensNeeded: 3,
		DurationSeconds: 30, Priority: sluicev1.Priority_PRIORITY_HIGH})
	if err != nil || a.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_GRANTED || a.GetTokensReserved() != 3 ||
		a.GetPositionInQueue() != 0 || !a.GetExpiresAt().AsTime().Equal(epoch.Add(30*time.Second)) {
		t.Fatalf("reserve a: %v %v, want granted 3 until epoch+30s", a, err)
	}
	b, err := c.Reserve(ctx(t), &sluicev1.ReserveRequest{ClientId: "b", Resource: "/api/orders", TokensNeeded: 4, DurationSeconds: 30})
	if err != nil || b.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_QUEUED || b.GetTokensReserved() != 0 ||
		b.GetTokensNeeded() != 4 || b.GetPositionInQueue() != 1 || !b.GetEstimatedGrantAt().AsTime().After(epoch) {
		t.Fatalf("reserve b: %v %v, want queued first", b, err)
	}
	g, err := c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: b.GetReservationId(), ClientId: "b"})
	if err != nil || g.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_QUEUED || g.GetPositionInQueue() != 1 || g.GetRule() != "orders" {
		t.Fatalf("get b: %v %v", g, err)
	}

	// b, refused by the limits, is told its place and wait.
	for i := range 6 {
		r, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "b", Resource: "/api/orders"})
		switch {
		case err != nil:
			t.Fatalf("check %d of b: %v", i, err)
		case i < 5 && (!r.GetAllowed() || r.QueuePosition != nil):
			t.Fatalf("check %d of b: %v, want allowed without a queue position", i, r)
		case i == 5 && (r.GetAllowed() || r.GetQueuePosition() != 1 || r.GetEstimatedWaitMs() <= 0 || r.EstimatedWaitMs == nil):
			t.Fatalf("check %d of b: %v, want denied with queue_position 1 and a wait", i, r)
		}
	}

	// a's check draws from its reservation; a cost the balance cannot
	// cover falls to the limits.
	r, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "a", Resource: "/api/orders", ReservationId: a.GetReservationId()})
	if err != nil || !r.GetAllowed() || r.GetSource() != "reservation" || r.GetLimit() != 3 || r.GetRemaining() != 2 ||
		r.GetReservationId() != a.GetReservationId() || r.GetRule() != "orders" {
		t.Fatalf("check with the reservation: %v %v", r, err)
	}
	r, err = c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "a", Resource: "/api/orders", ReservationId: a.GetReservationId(), Cost: ptr(int64(3))})
	if err != nil || !r.GetAllowed() || r.GetSource() != "store" || r.GetReservationId() != "" {
		t.Fatalf("check above the balance: %v %v, want decided by the limits", r, err)
	}
	g, err = c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: a.GetReservationId()})
	if err != nil || g.GetTokensRemaining() != 2 || g.GetTokensUsed() != 1 || g.GetClientId() != "a" ||
		!g.GetGrantedAt().AsTime().Equal(epoch) || !g.GetExpiresAt().AsTime().Equal(epoch.Add(30*time.Second)) {
		t.Fatalf("get a: %v %v", g, err)
	}

	// Another client's ID.
	for name, call := range map[string]func() error{
		"check": func() error {
			_, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "x", Resource: "/api/orders", ReservationId: a.GetReservationId()})
			return err
		},
		"get": func() error {
			_, err := c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: a.GetReservationId(), ClientId: "x"})
			return err
		},
		"release": func() error {
			_, err := c.ReleaseReservation(ctx(t), &sluicev1.ReleaseReservationRequest{ReservationId: a.GetReservationId(), ClientId: "x"})
			return err
		},
	} {
		if code, reason, _ := errInfo(call()); code != codes.PermissionDenied || reason != "forbidden" {
			t.Errorf("%s with another client's ID: %v %q, want PermissionDenied forbidden", name, code, reason)
		}
	}

	// Release returns the 2 tokens not used, once; b is then granted.
	rel, err := c.ReleaseReservation(ctx(t), &sluicev1.ReleaseReservationRequest{ReservationId: a.GetReservationId(), ClientId: "a"})
	if err != nil || rel.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_RELEASED || rel.GetTokensReturned() != 2 {
		t.Fatalf("release: %v %v, want released with 2 returned", rel, err)
	}
	_, err = c.ReleaseReservation(ctx(t), &sluicev1.ReleaseReservationRequest{ReservationId: a.GetReservationId(), ClientId: "a"})
	if code, reason, _ := errInfo(err); code != codes.NotFound || reason != "reservation_not_found" {
		t.Errorf("second release: %v, want NotFound reservation_not_found", err)
	}
	if _, err := c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: a.GetReservationId()}); status.Code(err) != codes.NotFound {
		t.Errorf("get after release: %v, want NotFound", err)
	}
	if _, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "a", Resource: "/api/orders", ReservationId: a.GetReservationId()}); status.Code(err) != codes.NotFound {
		t.Errorf("check with a released ID: %v, want NotFound", err)
	}
	g, err = c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: b.GetReservationId()})
	if err != nil || g.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_GRANTED || g.GetTokensRemaining() != 4 {
		t.Fatalf("b after the release: %v %v, want granted", g, err)
	}

	// A queued request is cancelled, returning nothing.
	q, err := c.Reserve(ctx(t), &sluicev1.ReserveRequest{ClientId: "c", Resource: "/api/orders", TokensNeeded: 2, DurationSeconds: 10})
	if err != nil || q.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_QUEUED {
		t.Fatalf("reserve c: %v %v, want queued", q, err)
	}
	rel, err = c.ReleaseReservation(ctx(t), &sluicev1.ReleaseReservationRequest{ReservationId: q.GetReservationId()})
	if err != nil || rel.GetStatus() != sluicev1.ReservationStatus_RESERVATION_STATUS_CANCELLED || rel.GetTokensReturned() != 0 {
		t.Fatalf("cancel: %v %v", rel, err)
	}
}

// TestGRPCReservationErrors checks that bad input is InvalidArgument
// naming the field, and a full queue ResourceExhausted with reason
// queue_full.
func TestGRPCReservationErrors(t *testing.T) {
	td := start(t, reservePolicy)
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	ok := &sluicev1.ReserveRequest{ClientId: "a", Resource: "/api/orders", TokensNeeded: 1, DurationSeconds: 10}
	for _, tc := range []struct {
		name  string
		edit  func(r *sluicev1.ReserveRequest)
		field string
	}{
		{"no tokens", func(r *sluicev1.ReserveRequest) { r.TokensNeeded = 0 }, "tokens_needed"},
		{"negative tokens", func(r *sluicev1.ReserveRequest) { r.TokensNeeded = -1 }, "tokens_needed"},
		{"above the capacity", func(r *sluicev1.ReserveRequest) { r.TokensNeeded = 6 }, "tokens_needed"},
		{"no duration", func(r *sluicev1.ReserveRequest) { r.DurationSeconds = 0 }, "duration_seconds"},
		{"too long", func(r *sluicev1.ReserveRequest) { r.DurationSeconds = 301 }, "duration_seconds"},
		{"unknown priority", func(r *sluicev1.ReserveRequest) { r.Priority = 9 }, "priority"},
		{"no client", func(r *sluicev1.ReserveRequest) { r.ClientId = "" }, "client_id"},
		{"control character", func(r *sluicev1.ReserveRequest) { r.ClientId = "a\x01" }, "client_id"},
		{"no rule", func(r *sluicev1.ReserveRequest) { r.Resource = "/nothing" }, "resource"},
	} {
		req := &sluicev1.ReserveRequest{ClientId: ok.ClientId, Resource: ok.Resource, TokensNeeded: ok.TokensNeeded, DurationSeconds: ok.DurationSeconds}
		tc.edit(req)
		_, err := c.Reserve(ctx(t), req)
		if code, reason, field := errInfo(err); code != codes.InvalidArgument || reason != "invalid_request" || field != tc.field {
			t.Errorf("%s: %v %q %q (%v), want InvalidArgument invalid_request naming %s", tc.name, code, reason, field, err, tc.field)
		}
	}
	if _, err := c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("get without an ID: %v, want InvalidArgument", err)
	}
	if _, err := c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: "rsv_nonsense"}); status.Code(err) != codes.NotFound {
		t.Errorf("get an unknown ID: %v, want NotFound", err)
	}
	_, err := c.BatchCheck(ctx(t), &sluicev1.BatchCheckRequest{ClientId: "a",
		Checks: []*sluicev1.CheckRequest{{Resource: "/api/orders", ReservationId: "rsv_x"}}})
	if _, _, field := errInfo(err); status.Code(err) != codes.InvalidArgument || field != "checks[0].reservation_id" {
		t.Errorf("batch with a reservation_id: %v, want InvalidArgument naming checks[0].reservation_id", err)
	}

	// A pool of capacity 1 queues at most 100 requests.
	req := &sluicev1.ReserveRequest{ClientId: "q", Resource: "/api/crowd", TokensNeeded: 1, DurationSeconds: 10}
	for i := range 101 {
		if _, err := c.Reserve(ctx(t), req); err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
	}
	_, err = c.Reserve(ctx(t), req)
	if code, reason, _ := errInfo(err); code != codes.ResourceExhausted || reason != "queue_full" {
		t.Errorf("reserve on a full queue: %v %q (%v), want ResourceExhausted queue_full", code, reason, err)
	}
}

// TestGRPCReservationsOff: a server without reservations answers their
// RPCs, and a check carrying a reservation_id, FailedPrecondition.
func TestGRPCReservationsOff(t *testing.T) {
	td := start(t, reservePolicy, func(c *daemon.Config) { c.NoReservations = true })
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	const id = "rsv_0000000000000000_00000000000000000000000000000000"
	for name, call := range map[string]func() error{
		"reserve": func() error {
			_, err := c.Reserve(ctx(t), &sluicev1.ReserveRequest{ClientId: "a", Resource: "/api/orders", TokensNeeded: 1, DurationSeconds: 1})
			return err
		},
		"get": func() error {
			_, err := c.GetReservation(ctx(t), &sluicev1.GetReservationRequest{ReservationId: id})
			return err
		},
		"release": func() error {
			_, err := c.ReleaseReservation(ctx(t), &sluicev1.ReleaseReservationRequest{ReservationId: id})
			return err
		},
		"check": func() error {
			_, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "a", Resource: "/api/orders", ReservationId: id})
			return err
		},
	} {
		if code, reason, _ := errInfo(call()); code != codes.FailedPrecondition || reason != "reservations_disabled" {
			t.Errorf("%s: %v %q, want FailedPrecondition reservations_disabled", name, code, reason)
		}
	}
	if r, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "a", Resource: "/api/orders"}); err != nil || !r.GetAllowed() {
		t.Errorf("a check without reservation_id: %v %v", r, err)
	}
}
