// Package echolimit rate-limits echo routes with a limiter of Sluice's
// package limiter, as package httplimit does for net/http: the same
// headers, statuses and bodies, from the same code (httplimit.Config.Admit).
//
//	lim, err := limiter.NewRedis(client, limiter.PerMinute(100))
//	...
//	e := echo.New()
//	e.IPExtractor = echo.ExtractIPDirect() // or ExtractIPFromXFFHeader behind a proxy
//	e.Use(echolimit.Middleware(lim, echolimit.KeyByRealIP))
//
// It is a module of its own, so that Sluice's module does not require echo.
package echolimit

import (
	"github.com/labstack/echo/v4"

	"github.com/sluicehq/sluice/limiter/httplimit"
)

// KeyFunc returns the key a request is limited under; an empty key refuses
// the request with 400.
type KeyFunc func(c echo.Context) string

// KeyByRealIP limits each client IP address on its own, as c.RealIP()
// reports it. Without an Echo.IPExtractor, echo takes it from
// X-Forwarded-For or X-Real-IP, which any client can set: set
// e.IPExtractor (echo.ExtractIPDirect, or ExtractIPFromXFFHeader with
// your proxies trusted) so that a client cannot pick its own key.
func KeyByRealIP(c echo.Context) string { return c.RealIP() }

// Middleware returns an echo middleware that limits every request by lim
// under the key key returns, with the zero httplimit.Config (failing open).
func Middleware(lim httplimit.Limiter, key KeyFunc) echo.MiddlewareFunc {
	return New(httplimit.Config{}, lim, key)
}

// New returns an echo middleware that limits every request by lim under
// the key key returns, as cfg says. A request refused is answered by the
// middleware (429, 400 or 503) and never reaches next.
func New(cfg httplimit.Config, lim httplimit.Limiter, key KeyFunc) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !cfg.Admit(c.Response(), c.Request(), lim, key(c)) {
				return nil
			}
			return next(c)
		}
	}
}
