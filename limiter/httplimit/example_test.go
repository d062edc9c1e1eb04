package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/httplimit"
)

// Two requests per minute per client IP address. The limiter's clock stands
// still here so that the output does not depend on when it runs; a real
// program leaves Config.Now nil, and would use limiter.NewRedis to share
// the limit between processes.
func ExampleMiddleware() {
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	lim, err := limiter.New(limiter.PerMinute(2), limiter.Config{Now: now})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	h := httplimit.Middleware(lim, httplimit.KeyByIP)(hello)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/", nil) // from 192.0.2.1
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="30"
}

// Limit by API key, and answer 503 rather than admit when the limiter
// cannot decide (with a Redis limiter: Redis down or too slow).
func ExampleConfig_Middleware() {
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	lim, err := limiter.New(limiter.PerSecond(10), limiter.Config{Now: now})
	if err != nil {
		log.Fatal(err)
	}
	mw := httplimit.Config{
		FailClosed: true,
		OnError:    func(r *http.Request, err error) { log.Print(err) },
		Now:        now,
	}.Middleware(lim, httplimit.KeyByHeader("X-API-Key"))
	h := mw(http.NotFoundHandler())

	for _, key := range []string{"k1", ""} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if key != "" {
			r.Header.Set("X-API-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d limit=%q reset=%q %s\n", w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Reset"), strings.TrimSpace(w.Body.String()))
	}
	// Output:
	// 404 limit="10" reset="1800000001" 404 page not found
	// 400 limit="" reset="" {"error":"invalid_request","field":"key","error_description":"the request carries no rate-limit key"}
}
