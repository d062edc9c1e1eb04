// Package adminapi serves Sluice's admin REST API under /api/v1/: rules,
// identities' tiers and overrides, emergency throttles, configs, admin
// tokens, the audit trail and the control plane's status, over a
// control.Plane. The wire format is documented in docs/api.md.
//
// Every route needs a bearer token of a role (viewer < operator < admin,
// see package auth); each token's reads and writes are rate limited with
// Sluice's own limiter. Every error becomes an HTTP status in one table
// (see statusOf); bad input is refused before the Plane is called.
package adminapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/limiter"
)

// Plane is what the API needs of the control plane. *control.Plane
// implements it; implementations must be safe for concurrent use. An
// ifVersion of 0 writes whatever the current version.
type Plane interface {
	Rules(ctx context.Context) ([]control.Rule, error)
	Rule(ctx context.Context, id string) (control.Rule, error)
	PutRule(ctx context.Context, a control.Actor, r control.Rule, ifVersion int64, reason string) (control.Rule, bool, error)
	DeleteRule(ctx context.Context, a control.Actor, id string, ifVersion int64, reason string) error

	Identity(ctx context.Context, kind, value string) (control.Identity, error)
	SetTier(ctx context.Context, a control.Actor, id control.Identity, ifVersion int64, reason string) (control.Identity, error)
	Overrides(ctx context.Context, kind, value string) ([]control.Override, error)
	PutOverride(ctx context.Context, a control.Actor, o control.Override) (control.Override, error)
	DeleteOverride(ctx context.Context, a control.Actor, id string, ifVersion int64, reason string) error

	Throttles(ctx context.Context) ([]control.Throttle, error)
	PutThrottle(ctx context.Context, a control.Actor, t control.Throttle) (control.Throttle, error)
	LiftThrottle(ctx context.Context, a control.Actor, id, reason string) (control.Throttle, error)

	PutConfig(ctx context.Context, a control.Actor, c control.Config, ifVersion int64) (control.Config, bool, error)
	Config(ctx context.Context, id string) (control.ConfigState, error)
	ConfigVersions(ctx context.Context, id string) ([]control.Config, error)
	RollbackConfig(ctx context.Context, a control.Actor, id string, toVersion int64, reason string) (control.Config, error)

	Tokens(ctx context.Context) ([]control.Token, error)
	PutToken(ctx context.Context, a control.Actor, t control.Token) error
	DeleteToken(ctx context.Context, a control.Actor, name, reason string) error

	Audit(ctx context.Context, f control.AuditFilter) ([]control.AuditEntry, error)
	Status() control.Status
}

// LimitsFunc returns the limits the applied policy gives one identity
// (kind "user", "client" or "api_key"), as a JSON-able value; GET
// /api/v1/{kind}/{id}/limits shows it as "limits". It must be safe for
// concurrent use.
type LimitsFunc func(kind, value string) any

// Rate limits of each admin token, per minute.
const (
	ReadsPerMinute  = 1000
	WritesPerMinute = 100
)

// MaxBodyBytes is the largest request body accepted (413 above).
const MaxBodyBytes = 1 << 20

// Config configures the API.
type Config struct {
	// Plane holds the objects. Required.
	Plane Plane
	// Tokens are the admin tokens of the tokens file (auth.ParseTokens),
	// and the daemon's generated loopback token, if any; the Plane's
	// tokens count too. With none at all, every route answers 404
	// "admin_disabled", saying how to enable the API.
	Tokens []control.Token
	// Limits fills "limits" of GET /api/v1/{kind}/{id}/limits; nil leaves
	// it out.
	Limits LimitsFunc
	// Now is the clock of overrides' duration_seconds, throttles' expiry
	// and the rate limits; nil means time.Now.
	Now func() time.Time
	// Logger receives errors the API answers with 5xx; nil discards them.
	Logger *slog.Logger
	// Analytics serves GET /api/v1/analytics to viewers; nil leaves the
	// route out.
	Analytics http.Handler
}

// Handler serves the admin API. It is safe for concurrent use.
type Handler struct {
	plane  Plane
	auth   *auth.Authenticator
	limits LimitsFunc
	now    func() time.Time
	log    *slog.Logger
	reads  *limiter.Limiter // per token name
	writes *limiter.Limiter // per token name
	mux    *http.ServeMux

	analytics http.Handler // nil: not routed
}

// New returns the admin API handler for cfg. It fails when cfg.Plane is
// nil or a token of cfg.Tokens is invalid (see auth.ValidateToken).
func New(cfg Config) (*Handler, error) {
	if cfg.Plane == nil {
		return nil, errors.New("adminapi: Config.Plane is required")
	}
	au, err := auth.New(cfg.Tokens, cfg.Plane.Tokens)
	if err != nil {
		return nil, err
	}
	h := &Handler{plane: cfg.Plane, auth: au, limits: cfg.Limits, now: cfg.Now, log: cfg.Logger, mux: http.NewServeMux(),
		analytics: cfg.Analytics}
	if h.now == nil {
		h.now = time.Now
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	lim := func(n int64) (*limiter.Limiter, error) {
		return limiter.New(sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: n, Window: time.Minute},
			limiter.Config{MaxKeys: 10000, Now: h.now})
	}
	if h.reads, err = lim(ReadsPerMinute); err != nil {
		return nil, err
	}
	if h.writes, err = lim(WritesPerMinute); err != nil {
		return nil, err
	}
	for _, rt := range h.routes() {
		h.mux.Handle(rt.method+" "+rt.path, h.guard(rt.role, rt.method != "GET", rt.handle))
	}
	h.mux.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		h.writeError(w, r, errNoRoute)
	})
	return h, nil
}

// route is one entry of the route table.
type route struct {
	method, path, role string
	handle             handlerFunc
}

// handlerFunc is a route's handler: it answers, or returns the error that
// writeError answers.
type handlerFunc func(w http.ResponseWriter, r *http.Request, a control.Actor) error

// routes is the route table: every route, the role it needs.
func (h *Handler) routes() []route {
	const v, o, a = control.RoleViewer, control.RoleOperator, control.RoleAdmin
	rs := []route{
		{"GET", "/api/v1/rules", v, h.listRules},
		{"GET", "/api/v1/rules/{id}", v, h.getRule},
		{"POST", "/api/v1/rules", a, h.postRule},
		{"PUT", "/api/v1/rules/{id}", a, h.putRule},
		{"DELETE", "/api/v1/rules/{id}", a, h.deleteRule},

		{"GET", "/api/v1/{kind}/{id}/limits", v, h.getLimits},
		{"GET", "/api/v1/{kind}/{id}/overrides", v, h.listOverrides},
		{"PUT", "/api/v1/{kind}/{id}/tier", o, h.putTier},
		{"POST", "/api/v1/{kind}/{id}/override", o, h.postOverride},
		{"DELETE", "/api/v1/{kind}/{id}/override/{override_id}", o, h.deleteOverride},

		{"GET", "/api/v1/emergency/throttles", v, h.listThrottles},
		{"POST", "/api/v1/emergency/throttle", o, h.postThrottle},
		{"DELETE", "/api/v1/emergency/throttle/{id}", o, h.liftThrottle},

		{"GET", "/api/v1/configs/{id}", v, h.getConfig},
		{"GET", "/api/v1/configs/{id}/versions", v, h.configVersions},
		{"POST", "/api/v1/configs", a, h.postConfig},
		{"POST", "/api/v1/configs/{id}/rollback", a, h.rollbackConfig},

		{"GET", "/api/v1/tokens", a, h.listTokens},
		{"POST", "/api/v1/tokens", a, h.postToken},
		{"DELETE", "/api/v1/tokens/{name}", a, h.deleteToken},

		{"GET", "/api/v1/audit", v, h.listAudit},
		{"GET", "/api/v1/control/status", v, h.controlStatus},
	}
	if h.analytics != nil {
		rs = append(rs, route{"GET", "/api/v1/analytics", v, h.getAnalytics})
	}
	return rs
}

// getAnalytics serves GET /api/v1/analytics with the handler of
// Config.Analytics, which answers its own errors.
func (h *Handler) getAnalytics(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	h.analytics.ServeHTTP(w, r)
	return nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// guard returns next behind the token check for role and the token's rate
// limit (of writes when write).
func (h *Handler) guard(role string, write bool, next handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.auth.Enabled(r.Context()) {
			h.writeError(w, r, errDisabled)
			return
		}
		act, err := h.auth.Authorize(r, role)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		lim := h.reads
		if write {
			lim = h.writes
		}
		if d := lim.DecideAt(act.Name, h.now(), 1); !d.Allowed {
			h.writeError(w, r, &rateLimitedError{retryAfter: d.RetryAfter})
			return
		}
		if err := next(w, r, act); err != nil {
			h.writeError(w, r, err)
		}
	})
}
