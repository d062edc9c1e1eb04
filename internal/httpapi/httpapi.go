// Package httpapi serves Sluice's HTTP JSON API: checks, batch checks,
// status, health, readiness, configuration status and metrics. The wire
// format is documented in docs/api.md.
//
// Every error becomes an HTTP status in one table (see statusOf); bad input
// is refused before the engine is called, so it changes no count.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/internal/engine"
)

// Engine is what the API needs of the engine. *engine.Engine implements it.
// Implementations must be safe for concurrent use.
type Engine interface {
	Check(ctx context.Context, c *engine.Check) (engine.Result, error)
	// BatchCheckInto writes the results of checks into a, which the
	// API reuses from batch to batch (see engine.BatchAnswer).
	BatchCheckInto(ctx context.Context, checks []engine.Check, mode engine.BatchMode, a *engine.BatchAnswer) error
	// Begin begins a request of about n checks, to be decided into a,
	// before it is decoded: a large one waits its turn (engine.Engine.Begin).
	Begin(ctx context.Context, n int, a *engine.BatchAnswer)
	Status(ctx context.Context, c *engine.Check) ([]engine.RuleResult, error)
	Ready(ctx context.Context) error
}

// ConfigStatus describes the configuration in force and the outcome of the
// last attempt to load one; GET /api/v1/config/status and GET /readyz
// report it.
type ConfigStatus struct {
	// Version is the version of the policy in force.
	Version string `json:"version"`
	// Path is the configuration file; empty for the built-in policy.
	Path string `json:"path,omitempty"`
	// LoadedAt is when the policy in force was applied.
	LoadedAt time.Time `json:"loaded_at"`
	// Reloads counts the policies applied since start, the first included.
	Reloads int64 `json:"reloads"`
	// LastError is the error of the last load when it failed (the policy in
	// force then stays); empty when the last load succeeded.
	LastError string `json:"last_error,omitempty"`
	// LastErrorAt is when LastError happened.
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// Limits on the input, enforced before the engine is called.
const (
	// MaxBodyBytes is the largest request body accepted (413 above).
	MaxBodyBytes = 64 << 10
	// MaxIdentifierBytes is the longest identifier (client_id, user, ip,
	// api_key, method, operation, idempotency_key) accepted.
	MaxIdentifierBytes = engine.MaxIdentifierLen
	// MaxResourceBytes is the longest resource accepted.
	MaxResourceBytes = engine.MaxResourceLen
	// MaxCost is the largest cost one check may ask for.
	MaxCost = engine.MaxCost
	// MaxBatch is the most checks one batch may hold.
	MaxBatch = engine.MaxBatch
)

// Config configures the API.
type Config struct {
	// Engine decides the checks. Required.
	Engine Engine
	// Metrics serves GET /metrics; nil answers 404.
	Metrics http.Handler
	// ConfigStatus reports the configuration status; nil answers 404 on
	// GET /api/v1/config/status.
	ConfigStatus func() ConfigStatus
	// Now is the clock used for reset_at; nil means time.Now.
	Now func() time.Time
	// ReadyTimeout bounds the store probe of GET /readyz; zero means 1s.
	ReadyTimeout time.Duration
	// Breaker, when set, reports the state of the store's circuit breaker
	// ("closed", "half_open", "open"), shown by GET /readyz.
	Breaker func() string
	// Logger receives errors the API answers with 5xx; nil discards them.
	Logger *slog.Logger
	// Reservations serves /api/v1/reserve and the reservation_id of
	// checks; nil answers 404 on those routes and 400 to a check with a
	// reservation_id.
	Reservations Reservations
	// History returns a client's checks of the 24 hours before now, for
	// GET /api/v1/status/{client_id}?include_history=true; nil refuses
	// include_history=true with 400.
	History func(ctx context.Context, client string, now time.Time) (History, error)
	// NoOperatorHeaders leaves out of the check answers the headers meant
	// for operators, for deployments that pass them on to end users:
	// X-RateLimit-Decision-Source, -Fallback-Reason, -Decision-Latency-Us,
	// -Throttle, -Policy (the rule's name), -Tier and -Shadow-Denied; and
	// the IETF RateLimit and RateLimit-Policy headers name the policy
	// "limit" instead of the rule. X-RateLimit-Limit, -Remaining, -Reset,
	// -Global-Remaining, -State and -Warning, RateLimit, RateLimit-Policy,
	// Retry-After and Retry-After-Ms stay. The JSON bodies are unchanged.
	NoOperatorHeaders bool
}

// History is a client's checks over the last 24 hours.
type History struct {
	// Requests and Blocked count the client's checks, and those refused.
	Requests, Blocked int64
	// AvgLatencyUS is the mean time the engine took to decide them, in
	// microseconds.
	AvgLatencyUS float64
}

// Handler serves the API. It is safe for concurrent use.
type Handler struct {
	eng     Engine
	metrics http.Handler
	cfgStat func() ConfigStatus
	now     func() time.Time
	readyTO time.Duration
	breaker func() string
	log     *slog.Logger
	resv    Reservations
	history func(ctx context.Context, client string, now time.Time) (History, error)
	noOps   bool // Config.NoOperatorHeaders
	mux     *http.ServeMux
	healthz []byte // the body of /healthz: status and build
}

// New returns the API handler for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Engine == nil {
		return nil, errors.New("httpapi: Config.Engine is required")
	}
	h := &Handler{
		healthz: healthzBody(buildinfo.Read()),
		eng:     cfg.Engine,
		metrics: cfg.Metrics,
		cfgStat: cfg.ConfigStatus,
		now:     cfg.Now,
		readyTO: cfg.ReadyTimeout,
		breaker: cfg.Breaker,
		log:     cfg.Logger,
		resv:    cfg.Reservations,
		history: cfg.History,
		noOps:   cfg.NoOperatorHeaders,
		mux:     http.NewServeMux(),
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.readyTO <= 0 {
		h.readyTO = time.Second
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for _, rt := range []struct {
		method, path string
		handle       http.HandlerFunc
	}{
		{"POST", "/api/v1/check", h.handleCheck},
		{"POST", "/api/v1/batch-check", h.handleBatch},
		{"GET", "/api/v1/status/{client_id}", h.handleStatus},
		{"GET", "/api/v1/config/status", h.handleConfigStatus},
		{"GET", "/healthz", h.handleHealthz},
		{"GET", "/readyz", h.handleReadyz},
		{"GET", "/metrics", h.handleMetrics},
	} {
		h.mux.HandleFunc(rt.method+" "+rt.path, rt.handle)
		// The same path with any other method: 405 in JSON (the more
		// specific pattern above wins for its own method).
		h.mux.Handle(rt.path, methodNotAllowed(rt.method))
	}
	if h.resv != nil {
		h.mux.HandleFunc("POST /api/v1/reserve", h.handleReserve)
		h.mux.Handle("/api/v1/reserve", methodNotAllowed("POST"))
		h.mux.HandleFunc("GET /api/v1/reserve/{id}", h.handleReserveGet)
		h.mux.HandleFunc("DELETE /api/v1/reserve/{id}", h.handleReserveDelete)
		h.mux.Handle("/api/v1/reserve/{id}", methodNotAllowed("GET, DELETE"))
	}
	h.mux.HandleFunc("/", h.handleNotFound)
	return h, nil
}

// methodNotAllowed answers 405 with the JSON error body, allowing method
// (and HEAD with GET).
func methodNotAllowed(method string) http.Handler {
	allow := method
	if strings.HasPrefix(method, "GET") {
		allow = "GET, HEAD" + strings.TrimPrefix(method, "GET")
	}
	body := []byte(`{"error":"method_not_allowed","error_description":"use ` + allow + `; see docs/api.md"}`)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeJSON(w, http.StatusMethodNotAllowed, body)
	})
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// healthzBody returns the body of /healthz for the build b.
func healthzBody(b buildinfo.Info) []byte {
	body, _ := json.Marshal(struct {
		Status string `json:"status"`
		buildinfo.Info
	}{"ok", b})
	return body
}

func (h *Handler) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, h.healthz)
}

func (h *Handler) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.readyTO)
	defer cancel()
	err := h.eng.Ready(ctx)
	b := getBuf()
	defer putBuf(b)
	status := http.StatusOK
	if err != nil {
		status = http.StatusServiceUnavailable
		b.b = append(b.b, `{"status":"unavailable","error":`...)
		b.b = appendString(b.b, err.Error())
	} else {
		b.b = append(b.b, `{"status":"ready"`...)
	}
	if h.breaker != nil {
		b.b = append(b.b, `,"breaker":`...)
		b.b = appendString(b.b, h.breaker())
	}
	if h.cfgStat != nil {
		b.b = append(b.b, `,"config":`...)
		b.b = appendConfigStatus(b.b, h.cfgStat())
	}
	b.b = append(b.b, '}')
	writeJSON(w, status, b.b)
}

func (h *Handler) handleConfigStatus(w http.ResponseWriter, r *http.Request) {
	if h.cfgStat == nil {
		h.handleNotFound(w, r)
		return
	}
	b := getBuf()
	defer putBuf(b)
	b.b = appendConfigStatus(b.b, h.cfgStat())
	writeJSON(w, http.StatusOK, b.b)
}

func (h *Handler) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if h.metrics == nil {
		h.handleNotFound(w, r)
		return
	}
	h.metrics.ServeHTTP(w, r)
}

func (h *Handler) handleNotFound(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusNotFound, []byte(`{"error":"not_found","error_description":"no such endpoint; see docs/api.md"}`))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	hdr["Content-Type"] = contentTypeJSON
	w.WriteHeader(status)
	w.Write(body)
}

var contentTypeJSON = []string{"application/json"}
