package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return t0 }

// served is a handler that counts the requests it serves.
type served struct{ n atomic.Int64 }

func (s *served) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.n.Add(1)
	w.Write([]byte("ok"))
}

func newMemory(t *testing.T, l sluice.Limit) *limiter.Limiter {
	t.Helper()
	lim, err := limiter.New(l, limiter.Config{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

func get(h http.Handler, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/api/orders", nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestMiddleware replays a limit of 2 per minute (a fixed window starting
// at t0) and checks statuses, headers and bodies against the server's.
func TestMiddleware(t *testing.T) {
	lim := newMemory(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 2, Window: time.Minute})
	next := &served{}
	h := Config{Now: clock}.Middleware(lim, KeyByIP)(next)
	reset := strconv.FormatInt(t0.Unix()+60, 10)
	for i, tc := range []struct {
		remote           string
		status           int
		remaining, retry string
	}{
		{"192.0.2.1:1000", 200, "1", ""},
		{"192.0.2.1:1001", 200, "0", ""},
		{"192.0.2.1:1002", 429, "0", "60"},
		{"192.0.2.2:1000", 200, "1", ""}, // another address: its own limit
	} {
		w := get(h, tc.remote)
		if w.Code != tc.status {
			t.Errorf("request %d from %s: status %d, want %d", i+1, tc.remote, w.Code, tc.status)
		}
		for name, want := range map[string]string{
			"X-RateLimit-Limit":     "2",
			"X-RateLimit-Remaining": tc.remaining,
			"X-RateLimit-Reset":     reset,
			"Retry-After":           tc.retry,
		} {
			if got := w.Header().Get(name); got != want {
				t.Errorf("request %d: %s = %q, want %q", i+1, name, got, want)
			}
		}
		if tc.status != 429 {
			continue
		}
		if got := w.Header().Get("Retry-After-Ms"); got != "60000" {
			t.Errorf("request %d: Retry-After-Ms = %q, want 60000", i+1, got)
		}
		var fields map[string]string
		if err := json.Unmarshal(w.Body.Bytes(), &fields); err != nil || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("429 body %q (%s): %v", w.Body, w.Header().Get("Content-Type"), err)
		}
		if fields["error"] != "rate_limit_exceeded" || !strings.Contains(fields["error_description"], "retry after 60 seconds") {
			t.Errorf("429 body %q: want error rate_limit_exceeded and the retry delay", w.Body)
		}
	}
	if got := next.n.Load(); got != 3 {
		t.Errorf("handler served %d requests, want 3", got)
	}
}

func TestNeverAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    sluice.Limit
		desc string
	}{
		{"deny all", sluice.Limit{Algorithm: sluice.GCRA, DenyAll: true, Window: time.Second}, "denies every request"},
		{"cost above the limit", sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 1, Window: time.Second}, "can never be admitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := newMemory(t, tc.l)
			next := &served{}
			h := Middleware(costly{lim}, KeyByIP)(next)
			w := get(h, "192.0.2.1:1")
			if w.Code != 429 || w.Header().Get("Retry-After") != "" || next.n.Load() != 0 {
				t.Errorf("status %d, Retry-After %q, served %d; want 429 without Retry-After, not served",
					w.Code, w.Header().Get("Retry-After"), next.n.Load())
			}
			if !strings.Contains(w.Body.String(), tc.desc) {
				t.Errorf("body %q does not say %q", w.Body, tc.desc)
			}
		})
	}
}

// costly asks for two units per request: more than a limit of one can
// ever admit.
type costly struct{ lim *limiter.Limiter }

func (c costly) Decide(ctx context.Context, key string, _ int64) (sluice.Decision, error) {
	return c.lim.Decide(ctx, key, 2)
}

func TestEmptyKey(t *testing.T) {
	next := &served{}
	h := Middleware(newMemory(t, limiter.PerSecond(5)), KeyByHeader("x-api-key"))(next)
	w := get(h, "192.0.2.1:1")
	if w.Code != http.StatusBadRequest || next.n.Load() != 0 {
		t.Fatalf("no API key: status %d, served %d; want 400, not served", w.Code, next.n.Load())
	}
	var body map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body["field"] != "key" {
		t.Errorf("400 body %q: want JSON naming the field key", w.Body)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "k1")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "4" {
		t.Errorf("with an API key: status %d, remaining %q; want 200, 4", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
}

func TestKeyByIP(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.1:1234":   "192.0.2.1",
		"[2001:db8::1]:80": "2001:db8::1",
		"192.0.2.9":        "192.0.2.9", // no port: as it is
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if got := KeyByIP(r); got != want {
			t.Errorf("KeyByIP(%q) = %q, want %q", remote, got, want)
		}
	}
}

// TestRedisDown checks the failure modes on a real Redis, killed: open by
// default (served, no rate-limit headers, the error reported), 503 with
// FailClosed.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim, err := limiter.NewRedis(c, limiter.PerMinute(1), limiter.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	next := &served{}
	var reported atomic.Int64
	onError := func(r *http.Request, err error) {
		if errors.Is(err, sluice.ErrStoreUnavailable) {
			reported.Add(1)
		}
	}
	open := Config{OnError: onError}.Middleware(lim, KeyByIP)(next)
	closed := Config{OnError: onError, FailClosed: true}.Middleware(lim, KeyByIP)(next)
	if w := get(open, "192.0.2.1:1"); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("Redis up: status %d, remaining %q; want 200, 0", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
	if w := get(open, "192.0.2.1:1"); w.Code != 429 {
		t.Fatalf("Redis up, second request: status %d, want 429", w.Code)
	}
	srv.Kill()
	if w := get(open, "192.0.2.1:1"); w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" {
		t.Errorf("Redis down, failing open: status %d, X-RateLimit-Limit %q; want 200 and no headers", w.Code, w.Header().Get("X-RateLimit-Limit"))
	}
	if w := get(closed, "192.0.2.1:1"); w.Code != 503 || !strings.Contains(w.Body.String(), `"unavailable"`) {
		t.Errorf("Redis down, failing closed: status %d, body %q; want 503 unavailable", w.Code, w.Body)
	}
	if got := reported.Load(); got != 2 {
		t.Errorf("OnError told of %d errors wrapping ErrStoreUnavailable, want 2", got)
	}
	if got := next.n.Load(); got != 2 {
		t.Errorf("handler served %d requests, want 2", got)
	}
}

// TestCoreModuleHasNoRouters checks the promise of contrib/: the router
// adapters are modules of their own, and Sluice's module requires neither
// gin nor echo.
func TestCoreModuleHasNoRouters(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{"github.com/gin-gonic/gin", "github.com/labstack/echo"} {
		if strings.Contains(string(b), mod) {
			t.Errorf("go.mod requires %s; it belongs in contrib/", mod)
		}
	}
}
