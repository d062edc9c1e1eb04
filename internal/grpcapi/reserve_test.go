package grpcapi

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/reserve"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/reservation"
)

func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason string
		field  string
	}{
		{fieldErr("tokens_needed", "must be positive, got 0"), codes.InvalidArgument, "invalid_request", "tokens_needed"},
		{reserveErr(&reservation.InvalidError{Field: "duration", Reason: "too long"}), codes.InvalidArgument, "invalid_request", "duration_seconds"},
		{fmt.Errorf("%w: 100 queued", reservation.ErrQueueFull), codes.ResourceExhausted, "queue_full", ""},
		{reservation.ErrNotFound, codes.NotFound, "reservation_not_found", ""},
		{reserve.ErrForbidden, codes.PermissionDenied, "forbidden", ""},
		{reserve.ErrDenyListed, codes.PermissionDenied, "forbidden", ""},
		{errReservationsOff, codes.FailedPrecondition, "reservations_disabled", ""},
		{errors.New("boom"), codes.Internal, "", ""},
	} {
		st := status.Convert(toStatus(tc.err))
		var reason, field string
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				reason = d.GetReason()
			case *errdetails.BadRequest:
				field = d.GetFieldViolations()[0].GetField()
			}
		}
		if st.Code() != tc.code || reason != tc.reason || field != tc.field {
			t.Errorf("toStatus(%v) = %v, reason %q, field %q; want %v, %q, %q", tc.err, st.Code(), reason, field, tc.code, tc.reason, tc.field)
		}
	}
}

// knownFields are the fields toAsk may name.
var knownFields = map[string]bool{"client_id": true, "resource": true, "tokens_needed": true, "duration_seconds": true, "priority": true}

// FuzzToAsk decodes arbitrary ReserveRequest messages: toAsk never panics,
// refuses with a field error naming a field of the message, and what it
// accepts is within the limits the Keeper relies on.
func FuzzToAsk(f *testing.F) {
	for _, r := range []*sluicev1.ReserveRequest{
		{ClientId: "a", Resource: "/r", TokensNeeded: 3, DurationSeconds: 30, Priority: sluicev1.Priority_PRIORITY_HIGH},
		{ClientId: "a", TokensNeeded: -1, DurationSeconds: 301},
		{ClientId: "a\x00", TokensNeeded: 1, DurationSeconds: 1, Priority: 7},
		{},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r sluicev1.ReserveRequest
		if err := proto.Unmarshal(data, &r); err != nil {
			return
		}
		a, err := toAsk(&r)
		if err != nil {
			var fe *engine.FieldError
			if !errors.As(err, &fe) || !knownFields[fe.Field] {
				t.Fatalf("toAsk(%v) = %v, want a field error naming a field of the request", &r, err)
			}
			if status.Code(toStatus(err)) != codes.InvalidArgument {
				t.Fatalf("toAsk(%v)'s error %v is not InvalidArgument", &r, err)
			}
			return
		}
		switch {
		case a.Client == "" || a.Client != r.GetClientId() || a.Resource != r.GetResource():
			t.Fatalf("toAsk(%v) = %+v: identity changed", &r, a)
		case a.Tokens <= 0 || a.Duration <= 0 || a.Duration > MaxReserveSeconds*time.Second || a.Duration%time.Second != 0:
			t.Fatalf("toAsk(%v) = %+v: out of bounds", &r, a)
		case a.Priority < reservation.High || a.Priority > reservation.Low:
			t.Fatalf("toAsk(%v) = %+v: bad priority", &r, a)
		}
	})
}
