// Analytics (internal/analytics): the recorder every decision of the
// engine goes to, its in-process store of the last hours, PostgreSQL when
// Config.AnalyticsURL names one, GET /api/v1/analytics and the history of
// GET /api/v1/status/{client_id}.

package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
	"github.com/sluicehq/sluice/internal/analyticsapi"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/httpapi"
)

// analyticsPath is where the analytics are served.
const analyticsPath = "/api/v1/analytics"

// analyticsRetryEvery is how often the daemon tries to set up a PostgreSQL
// that could not be reached at start.
const analyticsRetryEvery = 2 * time.Second

// DefaultAnalyticsRetention is how long PostgreSQL keeps the analytics
// when Config.AnalyticsRetention is zero.
const DefaultAnalyticsRetention = 30 * 24 * time.Hour

// startAnalytics starts the recorder, on the in-process store and, with
// AnalyticsURL, on PostgreSQL (migrated, its partitions made and its
// retention kept by pganalytics), and returns what the engine records to:
// nil with NoAnalytics. A PostgreSQL that cannot be reached is set up in
// the background, unless ExitOnUnavailableStore.
func (d *Daemon) startAnalytics(ctx context.Context) (engine.Analytics, error) {
	cfg := &d.cfg
	if cfg.NoAnalytics {
		if cfg.AnalyticsURL != "" {
			return nil, fmt.Errorf("daemon: --analytics and --no-analytics: choose one")
		}
		return nil, nil
	}
	mem := analytics.NewMemory(analytics.MemoryConfig{})
	rc := analytics.Config{Memory: mem, FlushInterval: cfg.AnalyticsFlushInterval, MaxBacklog: cfg.AnalyticsMaxBacklog, Now: cfg.Now}
	d.analyticsStore = mem
	if cfg.AnalyticsURL != "" {
		pc := pganalytics.Config{URL: cfg.AnalyticsURL, Retention: cfg.AnalyticsRetention, Now: cfg.Now, Logger: d.log}
		if !cfg.ExitOnUnavailableStore {
			// PostgreSQL down at start: the analytics stay in memory
			// (and the rows for PostgreSQL in the recorder's backlog)
			// until it is migrated.
			pc.RetryEvery = analyticsRetryEvery
		}
		pg, err := pganalytics.Open(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("daemon: --analytics: %w", err)
		}
		d.pganalytics, rc.Sink, d.analyticsStore = pg, pg, pg
	}
	d.recorder = analytics.NewRecorder(rc)
	d.changes.rec.Store(d.recorder)
	if err := d.reg.Register(analyticsCollector{d.recorder}); err != nil {
		d.closeAnalytics()
		return nil, fmt.Errorf("daemon: analytics metrics: %w", err)
	}
	ac := analyticsapi.Config{Store: d.analyticsStore, Gaps: d.analyticsGaps, Now: cfg.Now, Logger: d.log}
	if d.pganalytics != nil {
		ac.Source, ac.Fallback = "postgres", mem
	}
	h, err := analyticsapi.New(ac)
	if err != nil {
		d.closeAnalytics()
		return nil, err
	}
	d.analyticsHTTP = h
	return d.recorder, nil
}

// analyticsName says where cfg keeps the analytics, for the log: "off",
// "memory" or PostgreSQL's URL without its password and parameters (a
// password may be one of them).
func analyticsName(cfg *Config) string {
	switch {
	case cfg.NoAnalytics:
		return "off"
	case cfg.AnalyticsURL == "":
		return "memory"
	}
	u, err := url.Parse(cfg.AnalyticsURL)
	if err != nil || u.Host == "" {
		return "postgres (a connection string)"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.Redacted()
}

// closeAnalytics writes what the recorder holds and stops it, then closes
// PostgreSQL. Call it once no check runs any more.
func (d *Daemon) closeAnalytics() {
	if d.recorder != nil {
		d.recorder.Close()
	}
	if d.pganalytics != nil {
		d.pganalytics.Close()
	}
}

// Analytics returns the recorder of the decisions, nil with NoAnalytics.
func (d *Daemon) Analytics() *analytics.Recorder { return d.recorder }

// analyticsGaps reports the recorder's losses since start.
func (d *Daemon) analyticsGaps() analyticsapi.Gaps {
	st := d.recorder.Stats()
	return analyticsapi.Gaps{EventsDropped: st.Dropped, SinkDroppedRows: st.SinkDroppedRows, SinkHealthy: !st.SinkFailing}
}

// withAnalytics serves GET /api/v1/analytics without a token when there is
// no control plane (as the status of a client is); with one, the admin API
// serves it to viewers.
func (d *Daemon) withAnalytics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != analyticsPath || d.admin != nil {
			next.ServeHTTP(w, r)
			return
		}
		if d.analyticsHTTP == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "analytics_disabled",
				"error_description": "this instance records no analytics: it was started with --no-analytics"})
			return
		}
		d.analyticsHTTP.ServeHTTP(w, r)
	})
}

// history returns the counts of client over the 24 hours before now, for
// GET /api/v1/status/{client_id}?include_history=true: from PostgreSQL, or
// this process's own when PostgreSQL fails.
func (d *Daemon) history(ctx context.Context, client string, now time.Time) (httpapi.History, error) {
	f := analytics.Filter{Client: client, Start: now.Add(-24 * time.Hour), End: now, Granularity: analytics.Day, Top: 1}
	res, err := d.analyticsStore.Query(ctx, f)
	if err != nil && d.pganalytics != nil {
		d.log.WarnContext(ctx, "reading a client's history from PostgreSQL failed; answering from memory", "err", err)
		res, err = d.recorder.Memory().Query(ctx, f)
	}
	if err != nil {
		return httpapi.History{}, err
	}
	s := res.Summary
	return httpapi.History{Requests: s.Total, Blocked: s.Blocked, AvgLatencyUS: s.AvgLatencyUS}, nil
}

// analyticsCollector exports a Recorder's counters, read at each scrape.
type analyticsCollector struct{ r *analytics.Recorder }

var (
	analyticsEventsDesc = prometheus.NewDesc("sluice_analytics_events_total",
		"Decisions the analytics recorder counted.", nil, nil)
	analyticsDroppedDesc = prometheus.NewDesc("sluice_analytics_events_dropped_total",
		"Decisions the analytics recorder dropped because its queue was full.", nil, nil)
	analyticsFlushesDesc = prometheus.NewDesc("sluice_analytics_sink_flushes_total",
		"Writes of rollups and blocked events to PostgreSQL, failed ones included.", nil, nil)
	analyticsErrorsDesc = prometheus.NewDesc("sluice_analytics_sink_errors_total",
		"Writes to PostgreSQL that failed (their rows are kept, bounded, for the next).", nil, nil)
	analyticsBacklogDesc = prometheus.NewDesc("sluice_analytics_sink_backlog_rows",
		"Rollups waiting for PostgreSQL after a failed write.", nil, nil)
	analyticsDroppedRowsDesc = prometheus.NewDesc("sluice_analytics_sink_dropped_rows_total",
		"Rollups never written to PostgreSQL because the backlog was full: the gap in its history.", nil, nil)
	analyticsDroppedBlockedDesc = prometheus.NewDesc("sluice_analytics_sink_dropped_events_total",
		"Blocked events, changes and anomalies never written to PostgreSQL because the backlog was full.", nil, nil)
	analyticsUpDesc = prometheus.NewDesc("sluice_analytics_sink_up",
		"1 when the last write to PostgreSQL succeeded (or none was due), 0 when it failed.", nil, nil)
	analyticsChangesDroppedDesc = prometheus.NewDesc("sluice_analytics_changes_dropped_total",
		"Changes (configurations, control plane changes, throttles) dropped because their queue was full.", nil, nil)
	analyticsAnomaliesDesc = prometheus.NewDesc("sluice_analytics_anomalies_total",
		"Anomalies the detector found: minutes of a client on a resource far above their baseline.", nil, nil)
	analyticsUntrackedDesc = prometheus.NewDesc("sluice_analytics_anomaly_untracked_rows_total",
		"Rollups the anomaly detector left out because it tracked as many keys as it may.", nil, nil)
	analyticsMemoryRowsDesc = prometheus.NewDesc("sluice_analytics_memory_rows",
		"Rollups held by the in-process analytics store.", nil, nil)
)

func (c analyticsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{analyticsEventsDesc, analyticsDroppedDesc, analyticsFlushesDesc, analyticsErrorsDesc,
		analyticsBacklogDesc, analyticsDroppedRowsDesc, analyticsDroppedBlockedDesc, analyticsUpDesc, analyticsMemoryRowsDesc,
		analyticsChangesDroppedDesc, analyticsAnomaliesDesc, analyticsUntrackedDesc} {
		ch <- d
	}
}

func (c analyticsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Stats()
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(analyticsEventsDesc, st.Recorded)
	counter(analyticsDroppedDesc, st.Dropped)
	counter(analyticsFlushesDesc, st.SinkFlushes)
	counter(analyticsErrorsDesc, st.SinkErrors)
	counter(analyticsDroppedRowsDesc, st.SinkDroppedRows)
	counter(analyticsDroppedBlockedDesc, st.SinkDroppedEvents)
	counter(analyticsChangesDroppedDesc, st.ChangesDropped)
	counter(analyticsAnomaliesDesc, st.Anomalies)
	counter(analyticsUntrackedDesc, st.AnomalyRowsUntracked)
	ch <- prometheus.MustNewConstMetric(analyticsBacklogDesc, prometheus.GaugeValue, float64(st.SinkBacklogRows))
	up := 1.0
	if st.SinkFailing {
		up = 0
	}
	ch <- prometheus.MustNewConstMetric(analyticsUpDesc, prometheus.GaugeValue, up)
	rows, _ := c.r.Memory().Rows()
	ch <- prometheus.MustNewConstMetric(analyticsMemoryRowsDesc, prometheus.GaugeValue, float64(rows))
}
