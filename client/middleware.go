package client

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// Identity says whom and what a request is about, for Middleware. Empty
// Resource means the request's URL path and empty Method its method.
type Identity struct {
	ClientID, User, IP, APIKey  string
	Resource, Method, Operation string
	// Cost is the base cost; nil means 1.
	Cost *int64
	// Priority is "high", "normal" or "low"; empty means normal.
	Priority string
	// IdempotencyKey, when set, makes a repeat of the key by the same
	// ClientID within 5 minutes answer the first decision again and charge
	// nothing (see CheckRequest.IdempotencyKey). Middleware never takes it
	// from the request by itself: a key the end user chooses would let them
	// replay one allowed decision for free, so set it only from a value the
	// application trusts, such as one it issued for the operation.
	IdempotencyKey string
}

// Middleware rate-limits next: it asks c about every request, with the
// identity the identity function gives, sets the rate-limit headers of the
// answer on the response, and answers 429 (or 503) with the server's JSON
// body when the request is denied. A request whose identity has no
// ClientID, or that the server refuses as bad input (ErrInvalidRequest:
// say a control character or invalid UTF-8 in the path, or a path over
// 2048 bytes), is
// refused with 400 and a JSON error body; it never reaches next. When the
// server cannot be reached, or answers with another error, the request goes
// through, unless the client's Config.FailClosed is set (then 503).
func Middleware(c *Client, identity func(*http.Request) Identity, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := identity(r)
		if id.ClientID == "" {
			writeJSON(w, http.StatusBadRequest, []byte(`{"error":"invalid_request","field":"client_id","error_description":"the request carries no client identity"}`))
			return
		}
		req := CheckRequest{
			ClientID: id.ClientID, User: id.User, IP: id.IP, APIKey: id.APIKey,
			Resource: id.Resource, Method: id.Method, Operation: id.Operation,
			Cost: id.Cost, Priority: id.Priority, IdempotencyKey: id.IdempotencyKey,
		}
		if req.Resource == "" {
			req.Resource = r.URL.Path
		}
		if req.Method == "" {
			req.Method = r.Method
		}
		d, err := c.Check(r.Context(), req)
		if err != nil {
			var apiErr *APIError
			if errors.As(err, &apiErr) && errors.Is(err, ErrInvalidRequest) {
				writeJSON(w, http.StatusBadRequest, invalidRequestBody(apiErr))
				return
			}
			if c.failClosed {
				writeJSON(w, http.StatusServiceUnavailable, []byte(`{"error":"unavailable","error_description":"the rate limiter cannot be reached"}`))
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		for k, v := range d.Header {
			h[k] = v
		}
		if !d.Allowed {
			writeJSON(w, d.Status, d.Body)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// invalidRequestBody returns the middleware's 400 body for a check the
// server refused as bad input: the server's field and description for a
// 400; for a 413, whose body was the check's and not the end user's, a
// description of its own.
func invalidRequestBody(e *APIError) []byte {
	body := struct {
		Code        string `json:"error"`
		Field       string `json:"field,omitempty"`
		Description string `json:"error_description"`
	}{"invalid_request", e.Field, e.Description}
	if e.Status == http.StatusRequestEntityTooLarge {
		body.Field, body.Description = "", "the request is too large to be rate limited"
	}
	b, _ := json.Marshal(body) // strings only: cannot fail
	return b
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
