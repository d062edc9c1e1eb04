package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/jsonpath"
)

// Errors of the API itself.
var (
	// errTooLarge: a body over MaxBodyBytes (413).
	errTooLarge = errors.New("adminapi: request body too large")
	// errNoRoute: no such endpoint (404).
	errNoRoute = errors.New("adminapi: no such endpoint")
	// errDisabled: no admin token is configured (404).
	errDisabled = errors.New("adminapi: disabled")
)

// rateLimitedError is a token over its rate limit (429).
type rateLimitedError struct{ retryAfter time.Duration }

func (e *rateLimitedError) Error() string { return "admin rate limit exceeded for this token" }

// errorStatuses maps errors to HTTP statuses and error codes, the first
// match winning. FieldError, ConflictError and rateLimitedError are
// matched by type in statusOf.
var errorStatuses = []struct {
	err    error
	status int
	code   string
}{
	{auth.ErrNoToken, http.StatusUnauthorized, "unauthorized"},
	{auth.ErrInvalidToken, http.StatusUnauthorized, "unauthorized"},
	{auth.ErrForbidden, http.StatusForbidden, "forbidden"},
	{control.ErrNotFound, http.StatusNotFound, "not_found"},
	{control.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
	{errTooLarge, http.StatusRequestEntityTooLarge, "payload_too_large"},
	{errNoRoute, http.StatusNotFound, "not_found"},
	{errDisabled, http.StatusNotFound, "admin_disabled"},
}

// statusOf returns the HTTP status and error code for err.
func statusOf(err error) (int, string) {
	var fe *control.FieldError
	var ce *control.ConflictError
	var rl *rateLimitedError
	switch {
	case errors.As(err, &fe):
		return http.StatusBadRequest, "invalid_request"
	case errors.As(err, &ce):
		return http.StatusConflict, "conflict"
	case errors.As(err, &rl):
		return http.StatusTooManyRequests, "rate_limited"
	}
	for _, e := range errorStatuses {
		if errors.Is(err, e.err) {
			return e.status, e.code
		}
	}
	return http.StatusInternalServerError, "internal_error"
}

// errorBody is the JSON body of every error.
type errorBody struct {
	Error       string `json:"error"`
	Field       string `json:"field,omitempty"`
	Description string `json:"error_description"`
	// CurrentVersion is the object's version on a 409 (0: it does not exist).
	CurrentVersion *int64 `json:"current_version,omitempty"`
}

// writeError answers err with its status and the JSON error body.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code := statusOf(err)
	auth.Challenge(w, err)
	body := errorBody{Error: code, Description: err.Error()}
	var fe *control.FieldError
	var ce *control.ConflictError
	var rl *rateLimitedError
	switch {
	case errors.As(err, &fe):
		body.Field = fe.Field
		body.Description = fe.Field + ": " + fe.Msg
	case errors.As(err, &ce):
		body.CurrentVersion = &ce.Current
		body.Description = ce.Error() + "; read it again and retry with that version"
	case errors.As(err, &rl):
		secs := int64(math.Ceil(rl.retryAfter.Seconds()))
		if secs < 1 {
			secs = 1
		}
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		body.Description = fmt.Sprintf("this token may make %d reads and %d writes a minute; retry after %ds", ReadsPerMinute, WritesPerMinute, secs)
	case errors.Is(err, errTooLarge):
		body.Field = "body"
		body.Description = fmt.Sprintf("the request body is larger than %d bytes", MaxBodyBytes)
	case errors.Is(err, errDisabled):
		body.Description = "the admin API is disabled: no admin token is configured; start sluice serve with --admin-tokens FILE (see docs/operations.md)"
	case errors.Is(err, errNoRoute):
		body.Description = "no such endpoint; see docs/api.md"
	case errors.Is(err, auth.ErrNoToken):
		body.Description = "send an admin token as \"Authorization: Bearer TOKEN\"; see docs/operations.md"
	case errors.Is(err, auth.ErrInvalidToken):
		body.Description = "the token matches none configured; see docs/operations.md"
	case errors.Is(err, auth.ErrForbidden):
		body.Description = "the token's role may not do this; see docs/api.md for the role of each route"
	case errors.Is(err, control.ErrUnavailable):
		body.Description = "the configuration store is unavailable; nothing was written, retry later"
	}
	if status == http.StatusInternalServerError {
		h.log.ErrorContext(r.Context(), "admin request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		body.Description = "internal error"
	}
	writeJSON(w, status, body)
}

// writeJSON answers v in JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal_error","error_description":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// fieldErr returns a *control.FieldError for field.
func fieldErr(field, format string, args ...any) error {
	return &control.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// readBody reads r's body, at most MaxBodyBytes (errTooLarge above).
func readBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, fieldErr("body", "read: %v", err)
	}
	if len(data) > MaxBodyBytes {
		return nil, errTooLarge
	}
	return data, nil
}

// decodeStrict decodes the one JSON value data into v: unknown fields,
// values of the wrong type and trailing data are refused with a
// *control.FieldError naming the field.
func decodeStrict(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return fieldErr("body", "want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonFieldErr(data, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fieldErr("body", "want one JSON value, found more after it")
	}
	return nil
}

// jsonFieldErr turns an encoding/json error into a *control.FieldError.
func jsonFieldErr(data []byte, err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if te.Offset > 0 && te.Offset <= int64(len(data)) {
			// te.Offset is just past the value, or past the opening
			// brace or bracket of an object or array.
			field = jsonpath.FieldAt(data, int(te.Offset)-1)
		}
		if field == "" {
			field = "body"
		}
		return fieldErr(field, "want a JSON %s, got %s", te.Type.Kind(), te.Value)
	case errors.As(err, &se):
		return fieldErr("body", "malformed JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return fieldErr("body", "malformed JSON: unexpected end of input")
	}
	var fe *control.FieldError
	if errors.As(err, &fe) {
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return fieldErr(strings.Trim(name, `"`), "unknown field")
	}
	return fieldErr("body", "malformed JSON: %s", strings.TrimPrefix(msg, "json: "))
}

// ifVersion returns the version precondition of r: its If-Match header
// (a version number, quoted or not), else body, the body's version field
// (0 when absent). Both given and different is a 400.
func ifVersion(r *http.Request, body int64) (int64, error) {
	hv := strings.Trim(strings.TrimPrefix(strings.TrimSpace(r.Header.Get("If-Match")), "W/"), `"`)
	if hv == "" {
		if q := r.URL.Query().Get("version"); q != "" {
			hv = q
		} else {
			return body, nil
		}
	}
	v, err := strconv.ParseInt(hv, 10, 64)
	if err != nil || v < 0 {
		return 0, fieldErr("If-Match", "want an object version, a whole number")
	}
	if body != 0 && body != v {
		return 0, fieldErr("version", "%d differs from If-Match %d", body, v)
	}
	return v, nil
}
