// The sync of global limits between regions (internal/globalsync): started
// when Config.SyncURL is set, read by the engine for every check of a
// global limit, and reported at GET /internal/sync and as metrics.

package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/globalsync"
)

// syncPath is where the sync's state is served.
const syncPath = "/internal/sync"

// startSync starts the sync when Config.SyncURL is set, and returns the
// engine's view of the other regions (nil without a sync). It does not
// wait for NATS: an unreachable server is retried in the background, and
// checks decide meanwhile on what this region knows.
func (d *Daemon) startSync(ctx context.Context) (engine.GlobalView, error) {
	if d.cfg.SyncURL == "" {
		return nil, nil
	}
	if d.cfg.Region == "" {
		return nil, errors.New("daemon: the sync of global limits (--sync) needs this instance's region (--region)")
	}
	tc, err := syncTLS(&d.cfg)
	if err != nil {
		return nil, err
	}
	s, err := globalsync.Start(ctx, globalsync.Config{Region: d.cfg.Region, URL: d.cfg.SyncURL, Peers: d.cfg.SyncPeers,
		Instance: d.cfg.Instance, Logger: d.log, TLS: tc})
	if err != nil {
		return nil, fmt.Errorf("daemon: sync: %w", err)
	}
	if err := d.reg.Register(syncCollector{s}); err != nil {
		s.Close()
		return nil, fmt.Errorf("daemon: sync metrics: %w", err)
	}
	d.sync = s
	return globalsync.KeyView{Sync: s}, nil
}

// closeSync sends what the sync holds and stops it.
func (d *Daemon) closeSync() error {
	if d.sync == nil {
		return nil
	}
	return d.sync.Close()
}

// withSync serves GET /internal/sync before api.
func (d *Daemon) withSync(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != syncPath {
			api.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method_not_allowed", "error_description": "use GET"})
			return
		}
		if d.sync == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "sync_disabled",
				"error_description": "this instance syncs no global limits: start sluice serve with --region NAME and --sync nats://host:4222"})
			return
		}
		writeJSON(w, http.StatusOK, syncStatus(d.sync.Status()))
	})
}

// syncAnswer is the answer of GET /internal/sync.
type syncAnswer struct {
	Region        string       `json:"region"`
	Instance      string       `json:"instance"`
	Connected     bool         `json:"connected"`
	PendingEvents int          `json:"pending_events"`
	Windows       int          `json:"windows"`
	Peers         []syncPeer   `json:"peers"`
	Messages      syncMessages `json:"messages"`
}

type syncPeer struct {
	Region        string     `json:"region"`
	SyncLagMs     int64      `json:"sync_lag_ms"`
	PendingEvents int        `json:"pending_events"`
	LastSync      *time.Time `json:"last_sync"`
	Messages      int64      `json:"messages"`
}

type syncMessages struct {
	Published     int64 `json:"published"`
	PublishErrors int64 `json:"publish_errors"`
	Received      int64 `json:"received"`
	Malformed     int64 `json:"malformed"`
	Foreign       int64 `json:"foreign"`
	Own           int64 `json:"own"`
	Dropped       int64 `json:"dropped"`
}

func syncStatus(st globalsync.Status) syncAnswer {
	a := syncAnswer{Region: st.Region, Instance: st.Instance, Connected: st.Connected, PendingEvents: st.PendingEvents,
		Windows: st.Windows, Peers: []syncPeer{}, Messages: syncMessages{Published: st.Published, PublishErrors: st.PublishErrors,
			Received: st.Received, Malformed: st.Malformed, Foreign: st.Foreign, Own: st.Own, Dropped: st.Dropped}}
	for _, p := range st.Peers {
		sp := syncPeer{Region: p.Region, SyncLagMs: p.SyncLagMs, PendingEvents: p.PendingEvents, Messages: p.Messages}
		if !p.LastSync.IsZero() {
			t := p.LastSync.UTC()
			sp.LastSync = &t
		}
		a.Peers = append(a.Peers, sp)
	}
	return a
}

// syncCollector exports a Sync's state as metrics, read at each scrape.
type syncCollector struct{ s *globalsync.Sync }

var (
	syncLagDesc = syncDesc("sluice_sync_lag_ms",
		"p95 of the lag of recent sync messages from a peer region, from its clock to ours, in milliseconds.", []string{"peer"})
	syncLastDesc = syncDesc("sluice_sync_last_sync_timestamp_seconds",
		"When the last sync message from a peer region arrived, in Unix seconds.", []string{"peer"})
	syncPeerMessagesDesc = syncDesc("sluice_sync_peer_messages_total",
		"Sync messages merged from a peer region.", []string{"peer"})
	syncPendingDesc = syncDesc("sluice_sync_pending_events",
		"Windows of this region whose newest count the sync has not yet had acknowledged.", nil)
	syncConnectedDesc = syncDesc("sluice_sync_connected",
		"1 while the sync is connected to NATS with its stream in place, 0 otherwise.", nil)
	syncMessagesDesc = syncDesc("sluice_sync_messages_total",
		"Sync messages by outcome: published, publish_error, received, malformed, foreign, own (ignored).", []string{"outcome"})
	syncDroppedDesc = syncDesc("sluice_sync_dropped_total",
		"Counts this region could not hold for sending (more windows pending than the bound).", nil)
)

// SyncMetricNames returns the names of the sync's metrics, which a daemon
// with a sync exposes beside those of internal/metrics.
func SyncMetricNames() []string { return slices.Clone(syncNames) }

// syncDescs and syncNames are the sync's metrics and their names, as
// syncDesc made them.
var (
	syncDescs []*prometheus.Desc
	syncNames []string
)

func syncDesc(name, help string, labels []string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, nil)
	syncDescs, syncNames = append(syncDescs, d), append(syncNames, name)
	return d
}

func (c syncCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range syncDescs {
		ch <- d
	}
}

func (c syncCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Status()
	for _, p := range st.Peers {
		ch <- prometheus.MustNewConstMetric(syncLagDesc, prometheus.GaugeValue, float64(p.SyncLagMs), p.Region)
		if !p.LastSync.IsZero() {
			ch <- prometheus.MustNewConstMetric(syncLastDesc, prometheus.GaugeValue, float64(p.LastSync.UnixMilli())/1000, p.Region)
		}
		ch <- prometheus.MustNewConstMetric(syncPeerMessagesDesc, prometheus.CounterValue, float64(p.Messages), p.Region)
	}
	ch <- prometheus.MustNewConstMetric(syncPendingDesc, prometheus.GaugeValue, float64(st.PendingEvents))
	connected := 0.0
	if st.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(syncConnectedDesc, prometheus.GaugeValue, connected)
	for outcome, n := range map[string]int64{"published": st.Published, "publish_error": st.PublishErrors, "received": st.Received,
		"malformed": st.Malformed, "foreign": st.Foreign, "own": st.Own} {
		ch <- prometheus.MustNewConstMetric(syncMessagesDesc, prometheus.CounterValue, float64(n), outcome)
	}
	ch <- prometheus.MustNewConstMetric(syncDroppedDesc, prometheus.CounterValue, float64(st.Dropped))
}

// syncTLS returns the TLS configuration of the connections to NATS that
// cfg's SyncCAFile, SyncCertFile and SyncKeyFile describe, reading the
// files; nil when none is set.
func syncTLS(cfg *Config) (*tls.Config, error) {
	if cfg.SyncCAFile == "" && cfg.SyncCertFile == "" && cfg.SyncKeyFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.SyncCAFile != "" {
		pool, err := loadCAs(cfg.SyncCAFile)
		if err != nil {
			return nil, &TLSError{Option: "SyncCAFile", File: cfg.SyncCAFile, Err: err}
		}
		tc.RootCAs = pool
	}
	switch {
	case cfg.SyncCertFile == "" && cfg.SyncKeyFile != "":
		return nil, &TLSError{Option: "SyncCertFile", Err: fmt.Errorf("missing: the client key %q needs its certificate", cfg.SyncKeyFile)}
	case cfg.SyncCertFile != "" && cfg.SyncKeyFile == "":
		return nil, &TLSError{Option: "SyncKeyFile", Err: fmt.Errorf("missing: the client certificate %q needs its key", cfg.SyncCertFile)}
	case cfg.SyncCertFile != "":
		cert, err := readKeyPair("Sync", cfg.SyncCertFile, cfg.SyncKeyFile)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{*cert}
	}
	return tc, nil
}
