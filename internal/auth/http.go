package auth

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/internal/control"
)

// Challenge sets the WWW-Authenticate header of an answer to err and
// returns its status and error code: 401 "unauthorized" for ErrNoToken and
// ErrInvalidToken, 403 "forbidden" (error="insufficient_scope") for
// ErrForbidden, 503 "unavailable" for control.ErrUnavailable, and 0 for
// any other error.
func Challenge(w http.ResponseWriter, err error) (int, string) {
	switch {
	case errors.Is(err, ErrNoToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, ErrInvalidToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice", error="invalid_token"`)
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, ErrForbidden):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice", error="insufficient_scope"`)
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, control.ErrUnavailable):
		return http.StatusServiceUnavailable, "unavailable"
	}
	return 0, ""
}

// Authorize returns the actor of the request r when its token's role is at
// least need: the errors of Authenticate, or ErrForbidden.
func (a *Authenticator) Authorize(r *http.Request, need string) (control.Actor, error) {
	act, err := a.Authenticate(r.Context(), r.Header.Get("Authorization"))
	if err != nil {
		return act, err
	}
	if !Allows(act.Role, need) {
		return act, ErrForbidden
	}
	return act, nil
}

// Require returns next behind a check of the request's bearer token: no or
// an invalid token answers 401, a role below need 403, each with a JSON
// error body ({"error", "error_description"}) and WWW-Authenticate. next
// finds the actor with ActorFrom.
func (a *Authenticator) Require(need string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		act, err := a.Authorize(r, need)
		if err != nil {
			WriteError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithActor(r.Context(), act)))
	})
}

// WriteError answers an error of Authorize with its status (see
// Challenge; 500 for any other) and the JSON error body.
func WriteError(w http.ResponseWriter, err error) {
	status, code := Challenge(w, err)
	desc := err.Error()
	switch status {
	case http.StatusUnauthorized:
		desc = "send a valid token as \"Authorization: Bearer TOKEN\"; see docs/operations.md"
		if errors.Is(err, ErrInvalidToken) {
			desc = "the token matches none configured; see docs/operations.md"
		}
	case http.StatusForbidden:
		desc = "the token's role may not do this; see docs/api.md for the role of each route"
	case 0:
		status, code, desc = http.StatusInternalServerError, "internal_error", "internal error"
	}
	body, _ := json.Marshal(struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}{code, desc})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}
