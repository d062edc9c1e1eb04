package ginlimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/contrib/ginlimit"
	"github.com/sluicehq/sluice/limiter"
)

// Two requests per minute per client IP address on a gin router. The
// limiter's clock stands still so that the output does not depend on when
// it runs; a real program leaves it nil, and would use limiter.NewRedis to
// share the limit between processes.
func ExampleMiddleware() {
	gin.SetMode(gin.ReleaseMode)
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	lim, err := limiter.New(limiter.PerMinute(2), limiter.Config{Now: now})
	if err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.SetTrustedProxies(nil) // the client's address is RemoteAddr: no proxy in front
	r.Use(ginlimit.Middleware(lim, ginlimit.KeyByClientIP))
	r.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello") })

	for range 3 {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/hello", nil))
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="30"
}
