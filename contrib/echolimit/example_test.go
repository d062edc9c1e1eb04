package echolimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluicehq/sluice/contrib/echolimit"
	"github.com/sluicehq/sluice/limiter"
)

// Two requests per minute per client IP address on an echo router. The
// limiter's clock stands still so that the output does not depend on when
// it runs; a real program leaves it nil, and would use limiter.NewRedis to
// share the limit between processes.
func ExampleMiddleware() {
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	lim, err := limiter.New(limiter.PerMinute(2), limiter.Config{Now: now})
	if err != nil {
		log.Fatal(err)
	}
	e := echo.New()
	e.IPExtractor = echo.ExtractIPDirect() // no proxy in front: the client is RemoteAddr
	e.Use(echolimit.Middleware(lim, echolimit.KeyByRealIP))
	e.GET("/hello", func(c echo.Context) error { return c.String(http.StatusOK, "hello") })

	for range 3 {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/hello", nil))
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="30"
}
