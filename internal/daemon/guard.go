package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store"
)

// guardStore wraps a shared store (Redis, Redis Cluster) in a guard: the
// per-call deadline, the circuit breaker, the over-limit cache and the
// hot-key tier. The memory store is returned as it is: it answers in
// process and cannot fail the way a network store does. The returned
// closer stops the guard, then closes the store.
//
// Before wrapping it, guardStore warms the store up within ctx (the
// start's context, not the checks' deadline): one read of keys spread
// over the slots opens the connections and loads the script on every
// node, so that the first checks do not miss their deadline doing it. A
// failed warm-up is only logged: the breaker and the failure modes take
// over.
func guardStore(ctx context.Context, rawURL string, st engine.Store, closer func() error, cfg guard.Config, reg prometheus.Registerer, log *slog.Logger) (engine.Store, *guard.Guard, func() error, error) {
	if u, err := url.Parse(rawURL); err == nil && u.Scheme == "memory" {
		return st, nil, closer, nil
	}
	reqs := make([]store.Request, 32)
	for i := range reqs {
		reqs[i] = store.Request{Key: "rl:_warm:{" + strconv.Itoa(i) + "}", Params: &warmParams}
	}
	if err := st.Check(ctx, reqs, make([]sluice.Decision, len(reqs))); err != nil {
		log.Warn("the store did not answer the warm-up; checks follow their failure modes until it does", "err", err)
	}
	g, err := guard.New(st, cfg)
	if err != nil {
		closer()
		return nil, nil, nil, fmt.Errorf("daemon: %w", err)
	}
	if err := reg.Register(guardCollector{g}); err != nil {
		g.Close()
		closer()
		return nil, nil, nil, fmt.Errorf("daemon: metrics: %w", err)
	}
	return g.Engine(), g, func() error {
		g.Close()
		return closer()
	}, nil
}

// breakerState returns what reports the store's circuit breaker on GET
// /readyz: nil (no field) on the memory store.
func (d *Daemon) breakerState() func() string {
	if d.guard == nil {
		return nil
	}
	return func() string { return d.guard.BreakerState().String() }
}

var warmParams = algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Second})

// guardCollector exports a guard's state and counters, read from
// guard.Stats when scraped, under the sluice_guard_ prefix. (The guard
// also pushes its events to a guard.Observer, for a metrics package that
// wants them as they happen.)
type guardCollector struct{ g *guard.Guard }

var (
	descBreakerState = prometheus.NewDesc("sluice_guard_breaker_state",
		"State of the store's circuit breaker: 0 closed, 1 half-open, 2 open.", nil, nil)
	descBreakerTransitions = prometheus.NewDesc("sluice_guard_breaker_transitions_total",
		"Transitions of the store's circuit breaker, by the state entered (open, closed).", []string{"to"}, nil)
	descBreakerRefused = prometheus.NewDesc("sluice_guard_breaker_refused_total",
		"Store calls refused by the open circuit breaker, with no network call.", nil, nil)
	descStoreCalls = prometheus.NewDesc("sluice_guard_store_calls_total",
		"Calls the guard made to the store, and those that failed (down or past the deadline).", []string{"result"}, nil)
	descOverLimitHits = prometheus.NewDesc("sluice_guard_over_limit_hits_total",
		"Requests denied in process by the over-limit cache, with no store call.", nil, nil)
	descHotDecisions = prometheus.NewDesc("sluice_guard_hot_key_decisions_total",
		"Requests decided in process by the hot-key tier, by result (allowed, denied).", []string{"result"}, nil)
	descHotKeys = prometheus.NewDesc("sluice_guard_hot_keys",
		"Keys in the hot-key tier now.", nil, nil)
	descHotSyncs = prometheus.NewDesc("sluice_guard_hot_key_syncs_total",
		"Lease calls of the hot-key tier, by result (ok, error).", []string{"result"}, nil)
	descHotSyncLag = prometheus.NewDesc("sluice_guard_hot_key_sync_lag_seconds",
		"Time since the hot-key tier's last successful sync.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c guardCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBreakerState, descBreakerTransitions, descBreakerRefused, descStoreCalls,
		descOverLimitHits, descHotDecisions, descHotKeys, descHotSyncs, descHotSyncLag} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c guardCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.g.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descBreakerState, float64(s.Breaker))
	counter(descBreakerTransitions, s.BreakerOpened, "open")
	counter(descBreakerTransitions, s.BreakerClosed, "closed")
	counter(descBreakerRefused, s.BreakerRefused)
	counter(descStoreCalls, s.StoreCalls-s.StoreErrors, "ok")
	counter(descStoreCalls, s.StoreErrors, "error")
	counter(descOverLimitHits, s.OverLimitHits)
	counter(descHotDecisions, s.HotAdmits, "allowed")
	counter(descHotDecisions, s.HotDenies, "denied")
	gauge(descHotKeys, float64(s.HotKeys))
	counter(descHotSyncs, s.Syncs-s.SyncErrors, "ok")
	counter(descHotSyncs, s.SyncErrors, "error")
	gauge(descHotSyncLag, s.SyncLag.Seconds())
}
