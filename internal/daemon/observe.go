package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
)

// Events returns the ring of the last audit events, served on GET
// /api/v1/events.
func (d *Daemon) Events() *events.Ring { return d.ring }

// DebugAddr returns the address of the debug listener, or "" when there is
// none.
func (d *Daemon) DebugAddr() string {
	if d.debugLn == nil {
		return ""
	}
	return d.debugLn.Addr().String()
}

// IsLoopback reports whether the host of the listen address addr is a
// loopback address or "localhost".
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// startDebug opens the debug listener when one is configured.
func (d *Daemon) startDebug(ctx context.Context) error {
	addr := d.cfg.DebugAddr
	if addr == "" {
		return nil
	}
	if !d.cfg.DebugAllowRemote && !IsLoopback(addr) {
		return fmt.Errorf("daemon: debug address %q is not a loopback address; pprof exposes the process's memory and can stall it, so bind it to 127.0.0.1 or [::1] (or allow remote access explicitly)", addr)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("daemon: debug listener: %w", err)
	}
	d.debugLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}))
	d.debugSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	return nil
}

// cmdline serves the command line as pprof.Cmdline does (its arguments
// separated by NUL bytes), with the password of every URL hidden: a store
// URL given as a flag would otherwise be shown to whoever reaches the
// debug listener.
func cmdline(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	args := make([]string, len(os.Args))
	for i, a := range os.Args {
		if strings.Contains(a, "://") {
			a = redactURL(a)
		}
		args[i] = a
	}
	io.WriteString(w, strings.Join(args, "\x00"))
}

// serveDebug serves the debug listener, if any, until Shutdown.
func (d *Daemon) serveDebug() {
	if d.debugLn == nil {
		return
	}
	ln := d.debugLn
	d.log.Info("debug listener (pprof) serving", "addr", d.DebugAddr())
	d.wg.Go(func() {
		if err := d.serveHTTP(d.debugSrv, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("debug server stopped", "err", err)
		}
	})
}

// withEvents serves GET /api/v1/events from the event ring, and everything
// else from api. It compares the path rather than routing through a second
// ServeMux, which would cost every check a pattern match.
func (d *Daemon) withEvents(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/events" {
			api.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method_not_allowed",
				"error_description": "use GET"})
			return
		}
		d.handleEvents(w, r)
	})
}

// maxEventsLimit is the largest limit GET /api/v1/events accepts.
const maxEventsLimit = 10_000

// handleEvents answers GET /api/v1/events?limit=N&type=T: the last events,
// newest first.
func (d *Daemon) handleEvents(w http.ResponseWriter, r *http.Request) {
	limit := 100
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		// url.Query would drop the pair, answering as if it were absent:
		// every type for a type filter it cannot read.
		field := badQueryParam(r.URL.RawQuery)
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "field": field,
			"error_description": field + ": cannot be decoded (a bad % escape, or a ';', which must be sent as %3B)"})
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventsLimit {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "field": "limit",
				"error_description": "limit: want a whole number from 1 to " + strconv.Itoa(maxEventsLimit)})
			return
		}
		limit = n
	}
	var keep func(*events.Event) bool
	if types := q["type"]; len(types) > 0 {
		keep = func(ev *events.Event) bool { return slices.Contains(types, string(ev.Type)) }
	}
	evs, total := d.ring.Last(limit, keep)
	if evs == nil {
		evs = []events.Event{}
	}
	writeJSON(w, http.StatusOK, struct {
		Events   []events.Event `json:"events"`
		Total    int64          `json:"total"`
		Capacity int            `json:"capacity"`
	}{evs, total, d.ring.Capacity()})
}

// badQueryParam returns the name of the first parameter of the query raw
// that url.ParseQuery cannot decode; "query" when its name cannot be
// decoded either.
func badQueryParam(raw string) string {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		rawName, rawVal, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil || len(name) > 64 {
			return "query"
		}
		if _, err := url.QueryUnescape(rawVal); err != nil || strings.Contains(pair, ";") {
			return name
		}
	}
	return "query"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// configEvents emits the events of applying next after prev (nil at
// start): the configuration update, and each allow or deny list entry
// added or removed. Requires d.mu held.
func (d *Daemon) configEvents(prev, next *policy.Policy) {
	now := time.Now()
	if d.cfg.Now != nil { // the engine's clock, as the other events
		now = d.cfg.Now()
	}
	ev := events.Event{Type: events.ConfigUpdated, Time: now, Severity: events.SeverityInfo,
		Path: d.cfg.ConfigPath, Version: next.Version}
	if prev != nil {
		ev.PreviousVersion = prev.Version
	}
	d.events.Emit(ev)
	if prev == nil {
		return
	}
	pa, pd := prev.ListEntries()
	na, nd := next.ListEntries()
	diff := func(old, cur []string, added, removed events.Type) {
		for _, e := range cur {
			if _, found := slices.BinarySearch(old, e); !found {
				d.events.Emit(events.Event{Type: added, Time: now, Severity: events.SeverityInfo, Identity: e, Version: next.Version})
			}
		}
		for _, e := range old {
			if _, found := slices.BinarySearch(cur, e); !found {
				d.events.Emit(events.Event{Type: removed, Time: now, Severity: events.SeverityInfo, Identity: e, Version: next.Version})
			}
		}
	}
	diff(pa, na, events.AllowListAdded, events.AllowListRemoved)
	diff(pd, nd, events.DenyListAdded, events.DenyListRemoved)
}
