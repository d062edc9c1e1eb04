package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

// Reservations is what the API needs of the reservations of capacity.
// *reserve.Keeper implements it. Implementations must be safe for
// concurrent use.
type Reservations interface {
	Reserve(a reserve.Ask) (reserve.Result, error)
	Get(client, id string) (reserve.Status, error)
	Release(client, id string) (reserve.Ended, error)
	Use(q *policy.Request, id string, n int64) (reserve.Status, error)
	Queued(client, resource string) (position int64, at time.Time, ok bool)
}

// appendQueued adds to the JSON object b (closed) the place and the wait
// of a queued reservation of the check's client, when it has one: a check
// refused by the limits tells its client to wait its turn.
func (h *Handler) appendQueued(b []byte, c *engine.Check, now time.Time) []byte {
	if h.resv == nil || len(b) == 0 || b[len(b)-1] != '}' {
		return b
	}
	pos, at, ok := h.resv.Queued(c.ClientID, c.Resource)
	if !ok {
		return b
	}
	b = append(b[:len(b)-1], `,"queue_position":`...)
	b = strconv.AppendInt(b, pos, 10)
	b = append(b, `,"estimated_wait_ms":`...)
	b = strconv.AppendInt(b, max(ceilMillis(at.Sub(now)), 0), 10)
	return append(b, '}')
}

// reserveRequest is the JSON body of POST /api/v1/reserve.
type reserveRequest struct {
	ClientID        string `json:"client_id"`
	Resource        string `json:"resource"`
	TokensNeeded    *int64 `json:"tokens_needed"`
	DurationSeconds *int64 `json:"duration_seconds"`
	Priority        string `json:"priority"`
}

// reserveKeyBit is keyBit for reserveRequest.
func reserveKeyBit(name []byte) uint16 {
	switch string(name) {
	case "client_id":
		return 1 << 0
	case "resource":
		return 1 << 1
	case "tokens_needed":
		return 1 << 2
	case "duration_seconds":
		return 1 << 3
	case "priority":
		return 1 << 4
	}
	return 0
}

// maxReserveSeconds is the longest reservation, in seconds.
const maxReserveSeconds = reservation.MaxDuration / 1_000_000

// decodeReserve decodes and validates the body of POST /api/v1/reserve.
// Its errors are *engine.FieldError naming the field as on the wire.
// Whether tokens_needed fits the pool is the Keeper's to say.
func decodeReserve(data []byte) (reserve.Ask, error) {
	var rr reserveRequest
	if err := decodeStrictKeys(data, &rr, reserveKeyBit); err != nil {
		return reserve.Ask{}, err
	}
	for _, id := range [...]struct{ name, val string }{{"client_id", rr.ClientID}, {"resource", rr.Resource}} {
		if err := engine.ValidateField(id.name, id.val); err != nil {
			return reserve.Ask{}, err
		}
	}
	var p reservation.Priority
	switch rr.Priority {
	case "", "normal":
		p = reservation.Normal
	case "high":
		p = reservation.High
	case "low":
		p = reservation.Low
	default:
		return reserve.Ask{}, fieldErr("priority", "unknown priority %q (want high, normal or low)", truncate(rr.Priority))
	}
	switch {
	case rr.ClientID == "":
		return reserve.Ask{}, fieldErr("client_id", "required")
	case rr.TokensNeeded == nil:
		return reserve.Ask{}, fieldErr("tokens_needed", "required")
	case *rr.TokensNeeded <= 0:
		return reserve.Ask{}, fieldErr("tokens_needed", "must be positive, got %d", *rr.TokensNeeded)
	case rr.DurationSeconds == nil:
		return reserve.Ask{}, fieldErr("duration_seconds", "required")
	case *rr.DurationSeconds <= 0 || *rr.DurationSeconds > maxReserveSeconds:
		return reserve.Ask{}, fieldErr("duration_seconds", "must be 1 to %d, got %d", maxReserveSeconds, *rr.DurationSeconds)
	}
	return reserve.Ask{Client: rr.ClientID, Resource: rr.Resource, Tokens: *rr.TokensNeeded,
		Duration: time.Duration(*rr.DurationSeconds) * time.Second, Priority: p}, nil
}

// reserveErr turns the Keeper's refusal of a bad request into a field
// error named as on the wire; other errors are returned as they are.
func reserveErr(err error) error {
	if field, reason, ok := reserve.InvalidField(err); ok {
		return fieldErr(field, "%s", reason)
	}
	return err
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func (h *Handler) handleReserve(w http.ResponseWriter, r *http.Request) {
	b := getBuf()
	defer putBuf(b)
	if err := readBody(r, b); err != nil {
		h.writeError(w, r, err)
		return
	}
	a, err := decodeReserve(b.b)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	res, err := h.resv.Reserve(a)
	if err != nil {
		h.writeError(w, r, reserveErr(err))
		return
	}
	if res.Granted {
		h.writeReserveJSON(w, r, http.StatusOK, struct {
			ID        string `json:"reservation_id"`
			Status    string `json:"status"`
			Tokens    int64  `json:"tokens_reserved"`
			ExpiresAt string `json:"expires_at"`
			Position  int64  `json:"position_in_queue"`
		}{res.ID, "granted", res.Tokens, stamp(res.ExpiresAt), 0})
		return
	}
	h.writeReserveJSON(w, r, http.StatusAccepted, struct {
		ID          string `json:"reservation_id"`
		Status      string `json:"status"`
		Tokens      int64  `json:"tokens_needed"`
		Position    int64  `json:"position_in_queue"`
		EstimatedAt string `json:"estimated_grant_at"`
	}{res.ID, "queued", res.Tokens, res.Position, stamp(res.EstimatedAt)})
}

// statusBody is the JSON of GET /api/v1/reserve/{id}.
type statusBody struct {
	ID        string `json:"reservation_id"`
	Status    string `json:"status"`
	ClientID  string `json:"client_id"`
	Resource  string `json:"resource"`
	Rule      string `json:"rule"`
	Tokens    int64  `json:"tokens_reserved"`
	Remaining int64  `json:"tokens_remaining"`
	Used      int64  `json:"tokens_used"`
	GrantedAt string `json:"granted_at,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	// Position and EstimatedAt are set while queued.
	Position    int64  `json:"position_in_queue"`
	EstimatedAt string `json:"estimated_grant_at,omitempty"`
}

// reserveClient returns the optional client_id query parameter of GET and
// DELETE /api/v1/reserve/{id}: when given, the reservation must be its.
func reserveClient(r *http.Request) (string, error) {
	q := r.URL.Query()
	for name := range q {
		if name != "client_id" {
			return "", fieldErr(truncate(name), "unknown parameter")
		}
	}
	c := q.Get("client_id")
	return c, engine.ValidateField("client_id", c)
}

func (h *Handler) handleReserveGet(w http.ResponseWriter, r *http.Request) {
	client, err := reserveClient(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	st, err := h.resv.Get(client, r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	body := statusBody{ID: st.ID, Status: st.State, ClientID: st.Client, Resource: st.Resource,
		Rule: st.Rule, Tokens: st.Tokens, Remaining: st.Balance, Used: st.Used}
	if st.State == "granted" {
		body.GrantedAt, body.ExpiresAt = stamp(st.GrantedAt), stamp(st.ExpiresAt)
	} else {
		body.Position, body.EstimatedAt = st.Position, stamp(st.EstimatedAt)
	}
	h.writeReserveJSON(w, r, http.StatusOK, body)
}

func (h *Handler) handleReserveDelete(w http.ResponseWriter, r *http.Request) {
	client, err := reserveClient(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	end, err := h.resv.Release(client, id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeReserveJSON(w, r, http.StatusOK, struct {
		ID       string `json:"reservation_id"`
		Status   string `json:"status"`
		Returned int64  `json:"tokens_returned"`
	}{id, end.State, end.Returned})
}

func (h *Handler) writeReserveJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, status, body)
}

// checkReserved decides a check that carries a reservation ID: it draws
// the check's cost from the reservation, without touching the limits, and
// answers. It reports false, having answered nothing, when the reservation
// cannot cover the check (its balance is short, or it is still queued) or
// the caller is deny-listed: the limits then decide it as any other check.
func (h *Handler) checkReserved(w http.ResponseWriter, r *http.Request, c *engine.Check, id string) bool {
	if h.resv == nil {
		h.writeError(w, r, fieldErr("reservation_id", "reservations are not enabled on this server"))
		return true
	}
	cost := c.Cost
	st, err := h.resv.Use(&policy.Request{ClientID: c.ClientID, User: c.User, IP: c.IP, APIKey: c.APIKey,
		Resource: c.Resource, Method: c.Method, Operation: c.Operation}, id, cost)
	switch {
	case errors.Is(err, reservation.ErrInsufficient), errors.Is(err, reservation.ErrNotGranted),
		errors.Is(err, reserve.ErrDenyListed):
		return false
	case err != nil:
		h.writeError(w, r, err)
		return true
	}
	b := getBuf()
	defer putBuf(b)
	b.b = append(b.b, `{"status":200,"allowed":true,"limit":`...)
	b.b = strconv.AppendInt(b.b, st.Tokens, 10)
	b.b = append(b.b, `,"remaining":`...)
	b.b = strconv.AppendInt(b.b, st.Balance, 10)
	b.b = append(b.b, `,"reset_at":`...)
	b.b = strconv.AppendInt(b.b, st.ExpiresAt.Unix(), 10)
	b.b = append(b.b, `,"retry_after":0,"retry_after_ms":0,"rule":`...)
	b.b = appendString(b.b, st.Rule)
	b.b = append(b.b, `,"source":"reservation","cost":`...)
	b.b = strconv.AppendInt(b.b, cost, 10)
	b.b = append(b.b, `,"reservation_id":`...)
	b.b = appendString(b.b, id)
	b.b = append(b.b, '}')
	hd := w.Header()
	hd.Set("X-RateLimit-Limit", strconv.FormatInt(st.Tokens, 10))
	hd.Set("X-RateLimit-Remaining", strconv.FormatInt(st.Balance, 10))
	hd.Set("X-RateLimit-Reset", strconv.FormatInt(st.ExpiresAt.Unix(), 10))
	if !h.noOps {
		hd.Set("X-RateLimit-Decision-Source", "reservation")
	}
	writeJSON(w, http.StatusOK, b.b)
	return true
}
