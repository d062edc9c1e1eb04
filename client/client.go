// Package client is the Go client of Sluice's HTTP JSON API (see
// docs/api.md): checks, quotas and reservations of capacity; and a
// net/http middleware that rate-limits a handler with it.
//
//	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:8080"})
//	d, err := c.Check(ctx, client.CheckRequest{ClientID: "acme", Resource: "/api/v1/orders"})
//	if err == nil && !d.Allowed { /* wait d.RetryAfter */ }
//
// A client that will need capacity soon reserves it, then draws from it:
//
//	r, err := c.Reserve(ctx, client.ReserveRequest{ClientID: "acme", Resource: "/api/v1/orders", TokensNeeded: 10, DurationSeconds: 60})
//	d, err := c.Check(ctx, client.CheckRequest{ClientID: "acme", Resource: "/api/v1/orders", ReservationID: r.ID})
//	rel, err := c.ReleaseReservation(ctx, client.ReservationRef{ID: r.ID, ClientID: "acme"})
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors returned by the client. Test for them with errors.Is.
var (
	// ErrUnavailable is wrapped by errors that mean the server could not be
	// reached or did not answer in time.
	ErrUnavailable = errors.New("sluice client: server unavailable")
	// ErrInvalidRequest is wrapped by the errors of requests the server
	// refused as malformed (HTTP 400 and 413), or that the client refused
	// itself because the server would (invalid UTF-8); see *APIError.
	ErrInvalidRequest = errors.New("sluice client: invalid request")
	// ErrServer is wrapped by other unexpected answers of the server.
	ErrServer = errors.New("sluice client: server error")
)

// APIError is the error body the server sends with 4xx and 5xx answers
// other than decisions. The client also returns one, with Status 400, for
// a request it does not send because the server would refuse it and JSON
// cannot carry it as it is: a string field holding invalid UTF-8.
type APIError struct {
	// Status is the HTTP status.
	Status int `json:"-"`
	// Code is the error code, such as "invalid_request".
	Code string `json:"error"`
	// Field names the offending request field, when there is one.
	Field string `json:"field"`
	// Description says what is wrong.
	Description string `json:"error_description"`
}

// Error implements error.
func (e *APIError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("sluice: %d %s: %s", e.Status, e.Code, e.Description)
	}
	return fmt.Sprintf("sluice: %d %s: %s", e.Status, e.Code, e.Description)
}

// Unwrap returns ErrInvalidRequest for 400 and 413; for the errors of
// reservations, ErrReservationNotFound, ErrForbidden or ErrQueueFull;
// ErrServer otherwise.
func (e *APIError) Unwrap() error {
	switch {
	case e.Status == http.StatusBadRequest || e.Status == http.StatusRequestEntityTooLarge:
		return ErrInvalidRequest
	case e.Status == http.StatusNotFound && e.Code == "reservation_not_found":
		return ErrReservationNotFound
	case e.Status == http.StatusForbidden && e.Code == "forbidden":
		return ErrForbidden
	case e.Status == http.StatusTooManyRequests && e.Code == "queue_full":
		return ErrQueueFull
	}
	return ErrServer
}

// Config configures a Client.
type Config struct {
	// BaseURL is the server's HTTP address, such as
	// "http://127.0.0.1:8080". Required.
	BaseURL string
	// HTTPClient sends the requests; nil means a client of its own with
	// keep-alive connections.
	HTTPClient *http.Client
	// Timeout bounds each call when the context has no earlier deadline;
	// zero means 1 second.
	Timeout time.Duration
	// FailClosed makes Middleware answer 503 when the server cannot be
	// reached; by default it lets the request through (fails open).
	FailClosed bool
}

// Client calls a Sluice server. It is safe for concurrent use.
type Client struct {
	base       string
	hc         *http.Client
	timeout    time.Duration
	failClosed bool
}

// New returns a client for cfg.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("sluice client: BaseURL %q: want http://host:port", cfg.BaseURL)
	}
	c := &Client{base: strings.TrimRight(cfg.BaseURL, "/"), hc: cfg.HTTPClient, timeout: cfg.Timeout, failClosed: cfg.FailClosed}
	if c.hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		c.hc = &http.Client{Transport: t}
	}
	if c.timeout <= 0 {
		c.timeout = time.Second
	}
	return c, nil
}

// CheckRequest is one check. ClientID is required; the other fields are
// used by the rules that need them.
type CheckRequest struct {
	ClientID  string `json:"client_id"`
	Resource  string `json:"resource,omitempty"`
	Operation string `json:"operation,omitempty"`
	// Cost is the base cost; nil means 1, and 0 reads without consuming.
	Cost *int64 `json:"cost,omitempty"`
	// Priority is "high", "normal" or "low"; empty means normal.
	Priority string `json:"priority,omitempty"`
	// IdempotencyKey makes a repeat within 5 minutes return the first
	// decision and charge once.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	User           string `json:"user,omitempty"`
	IP             string `json:"ip,omitempty"`
	APIKey         string `json:"api_key,omitempty"`
	Method         string `json:"method,omitempty"`
	// ReservationID draws Cost from that reservation, which ClientID must
	// hold, without touching the limits (Decision.Source is then
	// "reservation"); when the reservation cannot cover it, the limits
	// decide. Check only: a batch refuses it.
	ReservationID string `json:"reservation_id,omitempty"`
}

// Cost returns a pointer to n, for CheckRequest.Cost.
func Cost(n int64) *int64 { return &n }

// RuleStatus is the outcome or state of one rule.
type RuleStatus struct {
	Rule         string `json:"rule"`
	Tier         string `json:"tier"`
	Allowed      bool   `json:"allowed"`
	Shadow       bool   `json:"shadow"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAt      int64  `json:"reset_at"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Cost         int64  `json:"cost"`
	Source       string `json:"source"`
}

// Decision is the server's answer to a check.
type Decision struct {
	// Status is the HTTP status: 200 allowed, 429 denied, 503 denied
	// because the server's store failed and the rule fails closed.
	Status int `json:"status"`
	// Resource is set in the results of a batch.
	Resource     string       `json:"resource"`
	Allowed      bool         `json:"allowed"`
	Limit        int64        `json:"limit"`
	Remaining    int64        `json:"remaining"`
	ResetAt      int64        `json:"reset_at"`
	RetryAfterMS int64        `json:"retry_after_ms"`
	Rule         string       `json:"rule"`
	Tier         string       `json:"tier"`
	Source       string       `json:"source"`
	Cost         int64        `json:"cost"`
	State        string       `json:"state"`
	ShadowDenied bool         `json:"shadow_denied"`
	Error        string       `json:"error"`
	Description  string       `json:"error_description"`
	Rules        []RuleStatus `json:"rules"`
	// ReservationID is set when the check drew from that reservation;
	// Limit is then the tokens reserved and Remaining its balance.
	ReservationID string `json:"reservation_id"`
	// QueuePosition and EstimatedWaitMS are set on a 429 when the client
	// has a reservation queued for the resource: its place in the queue (1
	// for the head) and the estimated wait until its grant, in
	// milliseconds.
	QueuePosition   int64 `json:"queue_position"`
	EstimatedWaitMS int64 `json:"estimated_wait_ms"`
	// Header holds the rate-limit headers of the answer (X-RateLimit-*,
	// RateLimit, RateLimit-Policy, Retry-After, Retry-After-Ms); nil in
	// the results of a batch.
	Header http.Header `json:"-"`
	// Body is the answer's JSON body; nil in the results of a batch.
	Body []byte `json:"-"`
}

// RetryAfter returns how long to wait before the same request may be
// admitted; 0 when allowed.
func (d *Decision) RetryAfter() time.Duration {
	return time.Duration(d.RetryAfterMS) * time.Millisecond
}

// badUTF8 returns the name of a string field of r holding invalid UTF-8;
// "" when none does. encoding/json would send such a field with U+FFFD in
// place of the bad bytes, which the server cannot refuse: distinct
// identities would then share one count.
func (r *CheckRequest) badUTF8() string {
	for _, f := range [...]struct{ name, val string }{
		{"client_id", r.ClientID}, {"resource", r.Resource}, {"operation", r.Operation},
		{"priority", r.Priority}, {"idempotency_key", r.IdempotencyKey}, {"user", r.User},
		{"ip", r.IP}, {"api_key", r.APIKey}, {"method", r.Method}, {"reservation_id", r.ReservationID},
	} {
		if !utf8.ValidString(f.val) {
			return f.name
		}
	}
	return ""
}

func invalidUTF8Error(field string) error {
	return &APIError{Status: http.StatusBadRequest, Code: "invalid_request", Field: field, Description: field + ": invalid UTF-8"}
}

// Check asks the server to decide one check.
func (c *Client) Check(ctx context.Context, req CheckRequest) (*Decision, error) {
	if f := req.badUTF8(); f != "" {
		return nil, invalidUTF8Error(f)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("sluice client: %w", err)
	}
	var d Decision
	resp, raw, err := c.do(ctx, http.MethodPost, "/api/v1/check", body)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		if err := json.Unmarshal(raw, &d); err == nil && d.Status == resp.StatusCode {
			d.Header = rateLimitHeaders(resp.Header)
			d.Body = raw
			return &d, nil
		}
	}
	return nil, apiError(resp.StatusCode, raw)
}

// BatchRequest is a batch of checks. Identity fields left empty in a check
// are taken from the batch.
type BatchRequest struct {
	ClientID string `json:"client_id,omitempty"`
	User     string `json:"user,omitempty"`
	IP       string `json:"ip,omitempty"`
	APIKey   string `json:"api_key,omitempty"`
	Priority string `json:"priority,omitempty"`
	// Mode is "all_or_nothing" (the default) or "best_effort".
	Mode   string         `json:"mode,omitempty"`
	Checks []CheckRequest `json:"checks"`
}

// BatchDecision is the answer to a batch.
type BatchDecision struct {
	// Status is 200 when every check was allowed, 207 for a best-effort
	// batch with denials, 429 (or 503) for an all-or-nothing batch that was
	// refused.
	Status  int        `json:"-"`
	Allowed bool       `json:"allowed"`
	Partial bool       `json:"partial"`
	Mode    string     `json:"mode"`
	Results []Decision `json:"results"`
}

// BatchCheck asks the server to decide a batch of checks.
func (c *Client) BatchCheck(ctx context.Context, req BatchRequest) (*BatchDecision, error) {
	for _, f := range [...]struct{ name, val string }{
		{"client_id", req.ClientID}, {"user", req.User}, {"ip", req.IP},
		{"api_key", req.APIKey}, {"priority", req.Priority}, {"mode", req.Mode},
	} {
		if !utf8.ValidString(f.val) {
			return nil, invalidUTF8Error(f.name)
		}
	}
	for i := range req.Checks {
		if f := req.Checks[i].badUTF8(); f != "" {
			return nil, invalidUTF8Error("checks[" + strconv.Itoa(i) + "]." + f)
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("sluice client: %w", err)
	}
	resp, raw, err := c.do(ctx, http.MethodPost, "/api/v1/batch-check", body)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusMultiStatus, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		var bd BatchDecision
		if err := json.Unmarshal(raw, &bd); err == nil && bd.Results != nil {
			bd.Status = resp.StatusCode
			return &bd, nil
		}
	}
	return nil, apiError(resp.StatusCode, raw)
}

// StatusRequest names the checks whose quota to read.
type StatusRequest struct {
	ClientID                                      string
	Resource, Operation, User, IP, APIKey, Method string
}

// Status returns the limit and remaining quota of every rule that applies,
// consuming nothing.
func (c *Client) Status(ctx context.Context, req StatusRequest) ([]RuleStatus, error) {
	if req.ClientID == "" {
		return nil, fmt.Errorf("%w: client_id: required", ErrInvalidRequest)
	}
	q := url.Values{}
	for k, v := range map[string]string{"resource": req.Resource, "operation": req.Operation, "user": req.User, "ip": req.IP, "api_key": req.APIKey, "method": req.Method} {
		if v != "" {
			q.Set(k, v)
		}
	}
	path := "/api/v1/status/" + pathSegment(req.ClientID)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, raw, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, apiError(resp.StatusCode, raw)
	}
	var out struct {
		Limits []RuleStatus `json:"limits"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%w: status body: %v", ErrServer, err)
	}
	return out.Limits, nil
}

// maxAnswer bounds the answer the client reads. A batch's answer names
// every rule of each of its checks: 1,000 checks matching 20 rules each
// come to about 5 MiB. A variable for the tests.
var maxAnswer int64 = 64 << 20

// do sends one request and reads the whole answer.
func (c *Client) do(ctx context.Context, method, path string, body []byte) (*http.Response, []byte, error) {
	// The earlier of ctx's deadline and the client's timeout wins.
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, nil, fmt.Errorf("sluice client: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: reading the answer: %v", ErrUnavailable, err)
	}
	if int64(len(raw)) > maxAnswer {
		return nil, nil, fmt.Errorf("%w: the answer is larger than %d MiB", ErrServer, maxAnswer>>20)
	}
	return resp, raw, nil
}

func apiError(status int, raw []byte) error {
	e := &APIError{Status: status}
	if err := json.Unmarshal(raw, e); err != nil || e.Code == "" {
		e.Code = http.StatusText(status)
		e.Description = strings.TrimSpace(string(raw))
	}
	return e
}

// rateLimitHeaders returns the rate-limit headers of h.
func rateLimitHeaders(h http.Header) http.Header {
	out := make(http.Header, 12)
	for k, v := range h {
		if strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Ratelimit") || strings.HasPrefix(k, "Retry-After") {
			out[k] = v
		}
	}
	return out
}
