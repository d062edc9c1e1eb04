package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors of the reservation calls, besides ErrUnavailable,
// ErrInvalidRequest and ErrServer. Test for them with errors.Is; the
// server's answer is an *APIError in the chain (errors.As).
var (
	// ErrReservationNotFound is wrapped by the answer to a reservation ID
	// that is unknown, released, cancelled or expired (HTTP 404
	// reservation_not_found).
	ErrReservationNotFound = errors.New("sluice client: reservation not found")
	// ErrForbidden is wrapped by the answer to another client's
	// reservation ID, or to a reservation asked for by a deny-listed
	// client (HTTP 403 forbidden).
	ErrForbidden = errors.New("sluice client: forbidden")
	// ErrQueueFull is wrapped by the refusal of a reservation whose pool's
	// queue is full (HTTP 429 queue_full).
	ErrQueueFull = errors.New("sluice client: reservation queue full")
	// ErrReservationsOff is wrapped by the answer of a server that serves
	// no reservations (their routes answer 404 not_found).
	ErrReservationsOff = errors.New("sluice client: the server serves no reservations")
)

// Statuses of a reservation, as in Reservation.Status and Release.Status.
const (
	StatusGranted   = "granted"
	StatusQueued    = "queued"
	StatusReleased  = "released"
	StatusCancelled = "cancelled"
)

// ReserveRequest asks for tokens of the pool of (ClientID, Resource): the
// pool of the first rule that matches them with a limit of its own (see
// docs/api.md, "Reservations").
type ReserveRequest struct {
	// ClientID is the client reserving; only it may use the reservation.
	// Required.
	ClientID string `json:"client_id"`
	Resource string `json:"resource,omitempty"`
	// TokensNeeded is 1 to the pool's capacity (the rule's limit).
	TokensNeeded int64 `json:"tokens_needed"`
	// DurationSeconds is how long the reservation lasts once granted: 1
	// to 300.
	DurationSeconds int64 `json:"duration_seconds"`
	// Priority is "high", "normal" or "low"; empty means normal.
	Priority string `json:"priority,omitempty"`
}

// Reservation is a reservation as the server reports it. Reserve fills
// ID, Status, Tokens and either Remaining and ExpiresAt (granted) or
// Position and EstimatedGrantAt (queued); GetReservation fills every field
// that applies.
type Reservation struct {
	// ID names the reservation: pass it as CheckRequest.ReservationID.
	ID string
	// Status is StatusGranted or StatusQueued.
	Status string
	// Tokens is the number asked for, held for it once granted.
	Tokens int64
	// Remaining is what checks may still draw, Used what they drew; both
	// 0 while queued.
	Remaining, Used int64
	// ClientID, Resource and Rule (whose limit makes the pool) are set by
	// GetReservation.
	ClientID, Resource, Rule string
	// GrantedAt (set by GetReservation) and ExpiresAt are set once
	// granted.
	GrantedAt, ExpiresAt time.Time
	// Position is the place in the queue while queued (1 for the head), 0
	// once granted; EstimatedGrantAt is then an upper estimate of the
	// grant.
	Position         int64
	EstimatedGrantAt time.Time
}

// Granted reports whether the reservation's tokens are held for it.
func (r *Reservation) Granted() bool { return r.Status == StatusGranted }

// reservationBody is the JSON of a reservation, as POST /api/v1/reserve
// (tokens_needed while queued) and GET /api/v1/reserve/{id} send it.
type reservationBody struct {
	ID               string    `json:"reservation_id"`
	Status           string    `json:"status"`
	ClientID         string    `json:"client_id"`
	Resource         string    `json:"resource"`
	Rule             string    `json:"rule"`
	TokensNeeded     int64     `json:"tokens_needed"`
	TokensReserved   int64     `json:"tokens_reserved"`
	TokensRemaining  int64     `json:"tokens_remaining"`
	TokensUsed       int64     `json:"tokens_used"`
	GrantedAt        time.Time `json:"granted_at"`
	ExpiresAt        time.Time `json:"expires_at"`
	Position         int64     `json:"position_in_queue"`
	EstimatedGrantAt time.Time `json:"estimated_grant_at"`
}

// decodeReservation decodes the JSON of a reservation. An answer without
// an ID, or with a status other than granted or queued, is ErrServer.
func decodeReservation(raw []byte) (*Reservation, error) {
	var b reservationBody
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, fmt.Errorf("%w: reservation body: %v", ErrServer, err)
	}
	if b.ID == "" || (b.Status != StatusGranted && b.Status != StatusQueued) {
		return nil, fmt.Errorf("%w: reservation body without an ID or a known status: %.200s", ErrServer, raw)
	}
	return &Reservation{
		ID: b.ID, Status: b.Status, Tokens: max(b.TokensReserved, b.TokensNeeded),
		Remaining: b.TokensRemaining, Used: b.TokensUsed,
		ClientID: b.ClientID, Resource: b.Resource, Rule: b.Rule,
		GrantedAt: b.GrantedAt, ExpiresAt: b.ExpiresAt,
		Position: b.Position, EstimatedGrantAt: b.EstimatedGrantAt,
	}, nil
}

// reservationError returns the error for an answer of a reservation route
// other than success: a 404 not_found is the server saying it has no such
// route.
func reservationError(status int, raw []byte) error {
	err := apiError(status, raw)
	if e, ok := err.(*APIError); ok && status == http.StatusNotFound && e.Code == "not_found" {
		return fmt.Errorf("%w: %w", ErrReservationsOff, err)
	}
	return err
}

// Reserve asks for a reservation: granted at once (Status StatusGranted)
// or queued until tokens come back to the pool (StatusQueued).
func (c *Client) Reserve(ctx context.Context, req ReserveRequest) (*Reservation, error) {
	for _, f := range [...]struct{ name, val string }{
		{"client_id", req.ClientID}, {"resource", req.Resource}, {"priority", req.Priority},
	} {
		if !utf8.ValidString(f.val) {
			return nil, invalidUTF8Error(f.name)
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("sluice client: %w", err)
	}
	resp, raw, err := c.do(ctx, http.MethodPost, "/api/v1/reserve", body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return nil, reservationError(resp.StatusCode, raw)
	}
	r, err := decodeReservation(raw)
	if err == nil && r.Granted() {
		r.Remaining = r.Tokens // just granted: nothing drawn yet
	}
	return r, err
}

// ReservationRef names a reservation.
type ReservationRef struct {
	// ID is the reservation's ID. Required.
	ID string
	// ClientID, when set, must be the holder's: another client's
	// reservation is then ErrForbidden.
	ClientID string
}

func (r *ReservationRef) path() (string, error) {
	if r.ID == "" {
		return "", &APIError{Status: http.StatusBadRequest, Code: "invalid_request", Field: "reservation_id", Description: "reservation_id: required"}
	}
	p := "/api/v1/reserve/" + pathSegment(r.ID)
	if r.ClientID != "" {
		p += "?" + url.Values{"client_id": {r.ClientID}}.Encode()
	}
	return p, nil
}

// GetReservation returns the state of a granted or queued reservation; a
// released, cancelled or expired one is ErrReservationNotFound.
func (c *Client) GetReservation(ctx context.Context, ref ReservationRef) (*Reservation, error) {
	path, err := ref.path()
	if err != nil {
		return nil, err
	}
	resp, raw, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, reservationError(resp.StatusCode, raw)
	}
	return decodeReservation(raw)
}

// Release says how ReleaseReservation ended a reservation.
type Release struct {
	ID string `json:"reservation_id"`
	// Status is StatusReleased (it was granted) or StatusCancelled (it was
	// queued).
	Status string `json:"status"`
	// TokensReturned is what went back to the pool: the tokens not used
	// (0 for a cancelled request). Tokens used stay held until expiry.
	TokensReturned int64 `json:"tokens_returned"`
}

// ReleaseReservation releases a granted reservation, returning the tokens
// not used to the pool, or cancels a queued one. Releasing it again is
// ErrReservationNotFound: tokens are returned once.
func (c *Client) ReleaseReservation(ctx context.Context, ref ReservationRef) (*Release, error) {
	path, err := ref.path()
	if err != nil {
		return nil, err
	}
	resp, raw, err := c.do(ctx, http.MethodDelete, path, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, reservationError(resp.StatusCode, raw)
	}
	var rel Release
	if err := json.Unmarshal(raw, &rel); err != nil || rel.ID == "" {
		return nil, fmt.Errorf("%w: release body: %.200s", ErrServer, raw)
	}
	return &rel, nil
}

// pathSegment escapes s as one segment of a URL path.
func pathSegment(s string) string {
	seg := url.PathEscape(s)
	if seg == "." || seg == ".." {
		// A dot segment would be removed from the path on its way.
		seg = strings.ReplaceAll(seg, ".", "%2E")
	}
	return seg
}
