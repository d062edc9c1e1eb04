// Package ginlimit rate-limits gin routes with a limiter of Sluice's
// package limiter, as package httplimit does for net/http: the same
// headers, statuses and bodies, from the same code (httplimit.Config.Admit).
//
//	lim, err := limiter.NewRedis(client, limiter.PerMinute(100))
//	...
//	r := gin.New()
//	r.Use(ginlimit.Middleware(lim, ginlimit.KeyByClientIP))
//
// It is a module of its own, so that Sluice's module does not require gin.
package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/limiter/httplimit"
)

// KeyFunc returns the key a request is limited under; an empty key refuses
// the request with 400.
type KeyFunc func(c *gin.Context) string

// KeyByClientIP limits each client IP address on its own, as c.ClientIP()
// reports it. gin reads it from X-Forwarded-For and X-Real-IP when the
// request comes from a trusted proxy, and trusts every address until told
// otherwise: call Engine.SetTrustedProxies with your proxies (or nil) so
// that a client cannot pick its own key.
func KeyByClientIP(c *gin.Context) string { return c.ClientIP() }

// Middleware returns a gin middleware that limits every request by lim
// under the key key returns, with the zero httplimit.Config (failing open).
func Middleware(lim httplimit.Limiter, key KeyFunc) gin.HandlerFunc {
	return New(httplimit.Config{}, lim, key)
}

// New returns a gin middleware that limits every request by lim under the
// key key returns, as cfg says. A request refused is aborted: the handlers
// after the middleware do not run.
func New(cfg httplimit.Config, lim httplimit.Limiter, key KeyFunc) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !cfg.Admit(c.Writer, c.Request, lim, key(c)) {
			c.Abort()
			return
		}
		c.Next()
	}
}
