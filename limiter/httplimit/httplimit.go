// Package httplimit rate-limits an http.Handler with a limiter of package
// limiter, in process memory or in Redis:
//
//	lim, err := limiter.NewRedis(client, limiter.PerMinute(100))
//	...
//	http.ListenAndServe(":8000", httplimit.Middleware(lim, httplimit.KeyByIP)(mux))
//
// Each request is checked under the key its KeyFunc returns, with a cost of
// one. Every answer carries the rate-limit headers that Sluice's server
// writes on its checks, with the same names and units (docs/api.md):
//
//	X-RateLimit-Limit      the limit (units per window)
//	X-RateLimit-Remaining  what is left of it after this request
//	X-RateLimit-Reset      the Unix second at which it is fully restored
//	Retry-After            on 429: seconds until the request would be admitted, rounded up
//	Retry-After-Ms         with Retry-After: the same in milliseconds
//
// A denied request gets 429 with the server's JSON body
// ({"error":"rate_limit_exceeded","error_description":"..."}) and never
// reaches the handler. A request whose key is empty gets 400 naming the
// field "key". When the limiter fails (Redis down or too slow), the request
// goes through without headers, unless Config.FailClosed is set (503).
//
// The server's headers about its policy and operation
// (X-RateLimit-Policy, -State, -Decision-Source, the IETF RateLimit
// fields, ...) are not written: a library limiter has no named rules.
package httplimit

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// Limiter decides requests. *limiter.Limiter (memory) and *limiter.Redis
// implement it; it must be safe for concurrent use. Decide decides a
// request of cost n for key now; an error means it could not decide.
type Limiter interface {
	Decide(ctx context.Context, key string, n int64) (sluice.Decision, error)
}

// KeyFunc returns the key a request is limited under: the caller's IP
// address, user, API key. An empty key refuses the request with 400.
type KeyFunc func(r *http.Request) string

// KeyByIP limits each client IP address on its own: the host of
// r.RemoteAddr. Behind a proxy or load balancer RemoteAddr is the proxy's;
// use a KeyFunc that reads the header the proxy sets then, and only then,
// since a client can put any X-Forwarded-For it likes.
func KeyByIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// KeyByHeader returns a KeyFunc that limits each value of the header name
// on its own, such as an API key; a request without it is refused with
// 400.
func KeyByHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// Config holds the knobs of a middleware. The zero value fails open and
// reports no errors.
type Config struct {
	// FailClosed makes a request that the limiter could not decide (Redis
	// down or too slow) get 503; by default it goes through.
	FailClosed bool
	// OnError, when set, is called with each error of the limiter and the
	// request it could not decide, to log or count it. It must be safe for
	// concurrent use.
	OnError func(r *http.Request, err error)
	// Now is the clock of X-RateLimit-Reset. Nil means time.Now.
	Now func() time.Time
}

// Middleware returns a middleware that limits every request by lim under
// the key key returns, with the zero Config: see the package documentation.
func Middleware(lim Limiter, key KeyFunc) func(http.Handler) http.Handler {
	return Config{}.Middleware(lim, key)
}

// Middleware returns a middleware that limits every request by lim under
// the key key returns, as c says.
func (c Config) Middleware(lim Limiter, key KeyFunc) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.Admit(w, r, lim, key(r)) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// Admit decides r by lim under key and sets the rate-limit headers on w.
// It reports whether r may be served; when it may not, it has written the
// answer (429, 400 for an empty key, 503 when failing closed). It is the
// middleware's whole work, for adapters to other routers.
func (c Config) Admit(w http.ResponseWriter, r *http.Request, lim Limiter, key string) bool {
	if key == "" {
		writeJSON(w, http.StatusBadRequest, noKeyBody)
		return false
	}
	d, err := lim.Decide(r.Context(), key, 1)
	if err != nil {
		if c.OnError != nil {
			c.OnError(r, err)
		}
		if c.FailClosed {
			writeJSON(w, http.StatusServiceUnavailable, unavailableBody)
			return false
		}
		return true
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(resetAt(now(), d.ResetAfter), 10))
	if d.Allowed {
		return true
	}
	if d.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(ceil(d.RetryAfter, time.Second), 10))
		h.Set("Retry-After-Ms", strconv.FormatInt(ceil(d.RetryAfter, time.Millisecond), 10))
	}
	writeJSON(w, http.StatusTooManyRequests, deniedBody(d))
	return false
}

var (
	noKeyBody       = []byte(`{"error":"invalid_request","field":"key","error_description":"the request carries no rate-limit key"}`)
	unavailableBody = []byte(`{"error":"unavailable","error_description":"the rate limiter cannot decide"}`)
)

// deniedBody returns the JSON body of a 429, in the words of the server's.
func deniedBody(d sluice.Decision) []byte {
	b := []byte(`{"error":"rate_limit_exceeded","error_description":"`)
	switch {
	case d.Reason == sluice.ReasonDenyAll:
		b = append(b, "The limit denies every request."...)
	case d.RetryAfter > 0:
		b = append(b, "Too many requests. Please retry after "...)
		b = strconv.AppendInt(b, ceil(d.RetryAfter, time.Second), 10)
		b = append(b, " seconds."...)
	default:
		b = append(b, "The request costs more than the limit allows; it can never be admitted."...)
	}
	return append(b, `"}`...)
}

// ceil returns d in whole units, rounded up.
func ceil(d, unit time.Duration) int64 {
	return int64((d + unit - 1) / unit)
}

// resetAt returns the Unix second at which a limit reset after d from now
// is fully restored, rounded up, as the server's X-RateLimit-Reset.
func resetAt(now time.Time, d time.Duration) int64 {
	t := now.Add(d)
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
