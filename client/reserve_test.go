package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/daemon"
)

// startServerWith is startServer with cfg edited by mod.
func startServerWith(t *testing.T, mod func(*daemon.Config)) *client.Client {
	t.Helper()
	cfg := daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
	mod(&cfg)
	d, err := daemon.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	})
	c, err := client.New(client.Config{BaseURL: "http://" + d.HTTPAddr()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReservations runs reservations through a server on the built-in
// policy (the demo rule: 5 per minute, so a pool of 5 tokens).
func TestReservations(t *testing.T) {
	c := startServer(t)
	ctx := context.Background()
	const res = "/api/v1/demo"

	r1, err := c.Reserve(ctx, client.ReserveRequest{ClientID: "c1", Resource: res, TokensNeeded: 3, DurationSeconds: 60, Priority: "high"})
	if err != nil || !r1.Granted() || r1.Tokens != 3 || r1.Remaining != 3 || r1.Position != 0 || !r1.ExpiresAt.After(time.Now()) {
		t.Fatalf("reserve c1: %+v, %v; want granted 3", r1, err)
	}
	r2, err := c.Reserve(ctx, client.ReserveRequest{ClientID: "c2", Resource: res, TokensNeeded: 4, DurationSeconds: 30})
	if err != nil || r2.Status != client.StatusQueued || r2.Tokens != 4 || r2.Position != 1 || r2.EstimatedGrantAt.IsZero() {
		t.Fatalf("reserve c2: %+v, %v; want queued first", r2, err)
	}
	g, err := c.GetReservation(ctx, client.ReservationRef{ID: r2.ID, ClientID: "c2"})
	if err != nil || g.Status != client.StatusQueued || g.Position != 1 || g.ClientID != "c2" || g.Rule != "demo" || g.Resource != res {
		t.Fatalf("get c2: %+v, %v", g, err)
	}

	// A check carrying the reservation draws from it.
	d, err := c.Check(ctx, client.CheckRequest{ClientID: "c1", Resource: res, ReservationID: r1.ID})
	if err != nil || !d.Allowed || d.Source != "reservation" || d.Limit != 3 || d.Remaining != 2 || d.ReservationID != r1.ID {
		t.Fatalf("check with the reservation: %+v, %v", d, err)
	}
	// c2, refused by the limits, is told its place and wait.
	for i := range 6 {
		d, err := c.Check(ctx, client.CheckRequest{ClientID: "c2", Resource: res})
		switch {
		case err != nil:
			t.Fatalf("check %d of c2: %v", i, err)
		case i < 5 && (!d.Allowed || d.QueuePosition != 0):
			t.Fatalf("check %d of c2: %+v, want allowed", i, d)
		case i == 5 && (d.Allowed || d.QueuePosition != 1 || d.EstimatedWaitMS <= 0):
			t.Fatalf("check %d of c2: %+v, want a 429 with queue_position 1 and a wait", i, d)
		}
	}

	// Another client's ID.
	_, err = c.Check(ctx, client.CheckRequest{ClientID: "c3", Resource: res, ReservationID: r1.ID})
	var ae *client.APIError
	if !errors.Is(err, client.ErrForbidden) || !errors.As(err, &ae) || ae.Status != 403 {
		t.Errorf("check with another client's ID: %v, want ErrForbidden (403)", err)
	}
	if _, err := c.GetReservation(ctx, client.ReservationRef{ID: r1.ID, ClientID: "c3"}); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("get another client's reservation: %v, want ErrForbidden", err)
	}
	if _, err := c.ReleaseReservation(ctx, client.ReservationRef{ID: r1.ID, ClientID: "c3"}); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("release another client's reservation: %v, want ErrForbidden", err)
	}

	// Release returns the 2 tokens not used, once; c2 is then granted.
	rel, err := c.ReleaseReservation(ctx, client.ReservationRef{ID: r1.ID, ClientID: "c1"})
	if err != nil || rel.Status != client.StatusReleased || rel.TokensReturned != 2 || rel.ID != r1.ID {
		t.Fatalf("release: %+v, %v; want released with 2 returned", rel, err)
	}
	if _, err := c.ReleaseReservation(ctx, client.ReservationRef{ID: r1.ID}); !errors.Is(err, client.ErrReservationNotFound) {
		t.Errorf("second release: %v, want ErrReservationNotFound", err)
	}
	if _, err := c.GetReservation(ctx, client.ReservationRef{ID: r1.ID}); !errors.Is(err, client.ErrReservationNotFound) {
		t.Errorf("get after release: %v, want ErrReservationNotFound", err)
	}
	g, err = c.GetReservation(ctx, client.ReservationRef{ID: r2.ID})
	if err != nil || !g.Granted() || g.Remaining != 4 || g.GrantedAt.IsZero() {
		t.Fatalf("c2 after the release: %+v, %v; want granted", g, err)
	}

	// A queued request is cancelled; the queue holds at most 100.
	var first *client.Reservation
	for i := range 100 {
		q, err := c.Reserve(ctx, client.ReserveRequest{ClientID: "q", Resource: res, TokensNeeded: 5, DurationSeconds: 10})
		if err != nil || q.Status != client.StatusQueued {
			t.Fatalf("reserve %d: %+v, %v; want queued", i, q, err)
		}
		if first == nil {
			first = q
		}
	}
	_, err = c.Reserve(ctx, client.ReserveRequest{ClientID: "q", Resource: res, TokensNeeded: 5, DurationSeconds: 10})
	if !errors.Is(err, client.ErrQueueFull) {
		t.Errorf("reserve on a full queue: %v, want ErrQueueFull", err)
	}
	rel, err = c.ReleaseReservation(ctx, client.ReservationRef{ID: first.ID})
	if err != nil || rel.Status != client.StatusCancelled || rel.TokensReturned != 0 {
		t.Errorf("cancel: %+v, %v", rel, err)
	}
}

func TestReservationBadInput(t *testing.T) {
	c := startServer(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req   client.ReserveRequest
		field string
	}{
		{client.ReserveRequest{ClientID: "a", Resource: "/api/v1/demo", DurationSeconds: 10}, "tokens_needed"},
		{client.ReserveRequest{ClientID: "a", Resource: "/api/v1/demo", TokensNeeded: 6, DurationSeconds: 10}, "tokens_needed"},
		{client.ReserveRequest{ClientID: "a", Resource: "/api/v1/demo", TokensNeeded: 1, DurationSeconds: 301}, "duration_seconds"},
		{client.ReserveRequest{ClientID: "a", Resource: "/api/v1/demo", TokensNeeded: 1, DurationSeconds: 10, Priority: "urgent"}, "priority"},
		{client.ReserveRequest{Resource: "/api/v1/demo", TokensNeeded: 1, DurationSeconds: 10}, "client_id"},
		{client.ReserveRequest{ClientID: "a\xff", TokensNeeded: 1, DurationSeconds: 10}, "client_id"},
	} {
		_, err := c.Reserve(ctx, tc.req)
		var ae *client.APIError
		if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &ae) || ae.Field != tc.field {
			t.Errorf("Reserve(%+v): %v, want ErrInvalidRequest naming %s", tc.req, err, tc.field)
		}
	}
	_, err := c.GetReservation(ctx, client.ReservationRef{})
	var ae *client.APIError
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &ae) || ae.Field != "reservation_id" {
		t.Errorf("GetReservation without an ID: %v, want ErrInvalidRequest naming reservation_id", err)
	}
	if _, err := c.GetReservation(ctx, client.ReservationRef{ID: ".."}); !errors.Is(err, client.ErrReservationNotFound) {
		t.Errorf("GetReservation(..): %v, want ErrReservationNotFound", err)
	}
}

func TestReservationsOff(t *testing.T) {
	c := startServerWith(t, func(cfg *daemon.Config) { cfg.NoReservations = true })
	ctx := context.Background()
	if _, err := c.Reserve(ctx, client.ReserveRequest{ClientID: "a", Resource: "/api/v1/demo", TokensNeeded: 1, DurationSeconds: 10}); !errors.Is(err, client.ErrReservationsOff) {
		t.Errorf("Reserve: %v, want ErrReservationsOff", err)
	}
	if _, err := c.ReleaseReservation(ctx, client.ReservationRef{ID: "rsv_x"}); !errors.Is(err, client.ErrReservationsOff) {
		t.Errorf("ReleaseReservation: %v, want ErrReservationsOff", err)
	}
	_, err := c.Check(ctx, client.CheckRequest{ClientID: "a", Resource: "/api/v1/demo", ReservationID: "rsv_x"})
	var ae *client.APIError
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &ae) || ae.Field != "reservation_id" {
		t.Errorf("Check with a reservation: %v, want ErrInvalidRequest naming reservation_id", err)
	}
}
