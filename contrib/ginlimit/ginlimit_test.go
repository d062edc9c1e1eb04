package ginlimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/limiter"
)

func TestMiddleware(t *testing.T) {
	gin.SetMode(gin.TestMode)
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	lim, err := limiter.New(limiter.PerMinute(2), limiter.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	if err := r.SetTrustedProxies(nil); err != nil {
		t.Fatal(err)
	}
	served := 0
	r.Use(Middleware(lim, KeyByClientIP))
	r.GET("/orders", func(c *gin.Context) {
		served++
		c.String(http.StatusOK, "ok")
	})
	for i, tc := range []struct {
		remote, xff string
		status      int
		remaining   string
	}{
		{"192.0.2.1:1000", "", 200, "1"},
		{"192.0.2.1:1001", "198.51.100.7", 200, "0"}, // an untrusted X-Forwarded-For changes nothing
		{"192.0.2.1:1002", "", 429, "0"},
		{"192.0.2.2:1000", "", 200, "1"},
	} {
		req := httptest.NewRequest(http.MethodGet, "/orders", nil)
		req.RemoteAddr = tc.remote
		if tc.xff != "" {
			req.Header.Set("X-Forwarded-For", tc.xff)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != tc.status || w.Header().Get("X-RateLimit-Remaining") != tc.remaining {
			t.Errorf("request %d: status %d, remaining %q; want %d, %q", i+1, w.Code, w.Header().Get("X-RateLimit-Remaining"), tc.status, tc.remaining)
		}
		if tc.status == 429 && (w.Header().Get("Retry-After") != "30" || w.Header().Get("Content-Type") != "application/json") {
			t.Errorf("request %d: Retry-After %q, Content-Type %q; want 30 and JSON", i+1, w.Header().Get("Retry-After"), w.Header().Get("Content-Type"))
		}
	}
	if served != 3 {
		t.Errorf("handler served %d requests, want 3", served)
	}
}
