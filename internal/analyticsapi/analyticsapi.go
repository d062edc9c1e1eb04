// Package analyticsapi serves GET /api/v1/analytics: what the limiter
// decided over a range of time, from an analytics store (the in-process
// one or PostgreSQL), as JSON.
//
// The query string is decoded by ParseQuery, which refuses bad input with
// a 400 naming the parameter. When the store fails (PostgreSQL down), the
// answer comes from the fallback store (the process's own) when there is
// one, saying so in its source, and is a 503 otherwise: the checks are
// unaffected either way. The answer's gaps say what the recorder could not
// count or could not write since the process started, so that a reader
// knows when figures are low because events were lost rather than because
// traffic was.
package analyticsapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// Store answers analytics queries. *analytics.Memory and
// *pganalytics.Store implement it. It must be safe for concurrent use.
type Store interface {
	Query(ctx context.Context, f analytics.Filter) (analytics.Result, error)
}

// Gaps is what the answers may be missing, since the process started.
type Gaps struct {
	// EventsDropped is the decisions never counted: the recorder's queue
	// was full.
	EventsDropped int64 `json:"events_dropped"`
	// SinkDroppedRows is the rollups never written to PostgreSQL: its
	// backlog was full while PostgreSQL failed.
	SinkDroppedRows int64 `json:"sink_dropped_rows"`
	// SinkHealthy is false while the last write to PostgreSQL failed;
	// true without PostgreSQL.
	SinkHealthy bool `json:"sink_healthy"`
}

// Config configures a Handler.
type Config struct {
	// Store answers the queries. Required.
	Store Store
	// Source names Store in the answers; empty means "memory".
	Source string
	// Fallback, when set, answers when Store fails, with the source
	// "memory".
	Fallback Store
	// Gaps reports the recorder's losses; nil reports none.
	Gaps func() Gaps
	// Now is the clock of the default end_time; nil means time.Now.
	Now func() time.Time
	// Timeout bounds one query; zero means 10s.
	Timeout time.Duration
	// Logger receives the store's failures; nil discards them.
	Logger *slog.Logger
}

// Handler serves GET /api/v1/analytics. It is safe for concurrent use.
type Handler struct {
	cfg Config
}

// New returns the handler of cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("analyticsapi: Config.Store is required")
	}
	if cfg.Source == "" {
		cfg.Source = "memory"
	}
	if cfg.Gaps == nil {
		cfg.Gaps = func() Gaps { return Gaps{SinkHealthy: true} }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg}, nil
}

// ServeHTTP answers GET and HEAD; other methods get 405.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "method_not_allowed", Description: "use GET"})
		return
	}
	f, err := ParseQuery(r.URL.RawQuery, h.cfg.Now())
	if err != nil {
		var fe *FieldError
		errors.As(err, &fe)
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "invalid_request", Field: fe.Field, Description: fe.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	source := h.cfg.Source
	res, err := h.cfg.Store.Query(ctx, f)
	if err != nil && h.cfg.Fallback != nil {
		h.cfg.Logger.WarnContext(r.Context(), "analytics query failed; answering from memory", "err", err)
		source = "memory"
		res, err = h.cfg.Fallback.Query(ctx, f)
	}
	if err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "analytics query failed", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "unavailable",
			Description: "the analytics store did not answer; checks are not affected"})
		return
	}
	a := answerOf(f, &res, h.cfg.Gaps())
	a.Source = source
	writeJSON(w, http.StatusOK, a)
}

type errorBody struct {
	Error       string `json:"error"`
	Field       string `json:"field,omitempty"`
	Description string `json:"error_description"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
