// Package metrics holds Sluice's Prometheus collectors and the methods the
// engine and the daemon call to move them. Every collector is registered on
// the prometheus.Registerer given to New: there is no global state.
//
// Cardinality is bounded by the configuration, never by traffic: labels
// carry rule ids (as configured), results, decision sources, API names and
// error kinds, never an identity (client, user, IP, API key) or a key.
//
// Every method is safe for concurrent use and does nothing on a nil
// *Metrics, so that components hold an optional *Metrics and call it
// unconditionally. The per-check methods (Decision, NearLimit, Check,
// StoreCall) reuse the label children they create: after the first call
// with given labels they take no lock and allocate nothing.
package metrics

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// BreakerState is the state of the circuit breaker around the store.
type BreakerState uint8

// The breaker states; the breaker state gauge holds their values.
const (
	BreakerClosed   BreakerState = 0
	BreakerHalfOpen BreakerState = 1
	BreakerOpen     BreakerState = 2
)

// LatencyBuckets are the upper bounds, in seconds, of the check latency
// histogram: from 10 µs to 1 s.
var LatencyBuckets = []float64{
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
}

// NearLimitRatio is the share of a limit above which an admitted check is
// counted as near the limit: the HTTP API's warning state.
const NearLimitRatio = 0.8

// Kind says what type a metric family is, for Names.
type Kind string

// The metric kinds.
const (
	KindCounter   Kind = "counter"
	KindGauge     Kind = "gauge"
	KindHistogram Kind = "histogram"
)

// Metrics holds Sluice's collectors. Create it with New; a nil *Metrics
// accepts every call and records nothing.
type Metrics struct {
	names map[string]Kind

	decisions   *prometheus.CounterVec // rule, result, source
	nearLimit   *prometheus.CounterVec // rule
	checks      [numAPIs][numOutcomes]prometheus.Counter
	checkTime   [numAPIs]prometheus.Observer
	storeTime   [numStoreOps]prometheus.Observer
	storeErrors [numStoreOps][numKinds]prometheus.Counter

	breakerState       *breakerCollector
	breakerTransitions *prometheus.CounterVec // to
	overLimitHits      prometheus.Counter
	overLimitEntries   prometheus.Gauge
	hotKeys            prometheus.Gauge
	hotKeysDetected    prometheus.Counter
	hotKeySyncLag      prometheus.Histogram
	hotKeySyncs        prometheus.Counter
	storeGathered      prometheus.Histogram
	storeFallbacks     *prometheus.CounterVec // reason, mode

	configInfo     *prometheus.GaugeVec // version
	reloadOK       prometheus.Gauge
	reloads        *prometheus.CounterVec // result
	reloadTime     prometheus.Histogram
	reloadLastGood prometheus.Gauge

	events        *prometheus.CounterVec // type
	eventsSampled *prometheus.CounterVec // type

	// children caches the label children of decisions and nearLimit: a
	// copy-on-write map read without a lock; mu serializes its writers.
	children atomic.Pointer[map[childKey]prometheus.Counter]
	mu       sync.Mutex
	// version is the config version label in force; requires mu.
	version string
}

// childKey identifies one label child of the family fam.
type childKey struct {
	rule, source string
	result       Result
	fam          family
}

// family names the counter vectors whose children child caches.
type family uint8

const (
	famDecisions family = iota
	famNearLimit
	famEvents
	famSampled
)

// New creates Sluice's collectors and registers them on reg. It fails
// when one of them is already registered there.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{names: map[string]Kind{}}
	var cs []prometheus.Collector
	add := func(name string, k Kind, c prometheus.Collector) {
		m.names[name] = k
		cs = append(cs, c)
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		add(name, KindCounter, c)
		return c
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		add(name, KindCounter, c)
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		add(name, KindGauge, g)
		return g
	}
	histVec := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		add(name, KindHistogram, h)
		return h
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
		add(name, KindHistogram, h)
		return h
	}

	bi := buildinfo.Read()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_build_info",
		Help: "Always 1; its labels say which build of Sluice runs: version, commit and Go version."},
		[]string{"version", "commit", "go_version"})
	build.WithLabelValues(bi.Version, bi.Commit, bi.GoVersion).Set(1)
	add("sluice_build_info", KindGauge, build)

	m.decisions = counterVec("sluice_decisions_total",
		"Decisions of one rule for one check, by rule id, result (allowed, denied, shadow_denied) and decision source (store, over_limit_cache, hot_key, fail_open, fail_closed, local, idempotent, allow_list, deny_list, no_rule).",
		"rule", "result", "source")
	m.nearLimit = counterVec("sluice_near_limit_total",
		"Checks a rule admitted with more than 80% of its limit used (the warning state of the HTTP API), by rule id.",
		"rule")
	checks := counterVec("sluice_checks_total",
		"Checks answered, by API (check, batch, envoy) and outcome (allowed, denied, unavailable, invalid, error). A batch counts once.",
		"api", "outcome")
	checkTime := histVec("sluice_check_duration_seconds",
		"Time the engine took to decide a check, by API (check, batch, envoy), transport excluded.",
		LatencyBuckets, "api")
	storeTime := histVec("sluice_store_call_duration_seconds",
		"Duration of store calls, by operation (check, check_all, check_all_once, reset, sync), failed calls included.",
		LatencyBuckets, "op")
	storeErrors := counterVec("sluice_store_errors_total",
		"Store calls that failed, by operation and kind (timeout, unavailable, canceled, other).",
		"op", "kind")
	for a := range numAPIs {
		for o := range numOutcomes {
			m.checks[a][o] = checks.WithLabelValues(a.String(), o.String())
		}
		m.checkTime[a] = checkTime.WithLabelValues(a.String())
	}
	for op := range numStoreOps {
		m.storeTime[op] = storeTime.WithLabelValues(op.String())
		for k := range numKinds {
			m.storeErrors[op][k] = storeErrors.WithLabelValues(op.String(), k.String())
		}
	}

	// One collector for the breaker's gauge and transitions, so that a
	// scrape sees the state and the transition into it together (see
	// RefreshBreakerState).
	m.breakerState = &breakerCollector{
		state: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_breaker_state",
			Help: "State of the circuit breaker around the store: 0 closed, 1 half-open, 2 open."}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_breaker_transitions_total",
			Help: "Changes of the circuit breaker's state, by the state entered (closed, half_open, open)."}, []string{"to"}),
	}
	m.names["sluice_breaker_transitions_total"] = KindCounter
	add("sluice_breaker_state", KindGauge, m.breakerState)
	m.breakerTransitions = m.breakerState.transitions
	m.storeFallbacks = counterVec("sluice_store_fallbacks_total",
		"Rule decisions taken without the store, by reason (unreachable, stalled, deadline, breaker_open, overloaded) and failure mode applied (local, fail_open, fail_closed).",
		"reason", "mode")
	for _, r := range FallbackReasons {
		for _, md := range []string{"local", "fail_open", "fail_closed"} {
			m.storeFallbacks.WithLabelValues(r, md)
		}
	}
	m.overLimitHits = counter("sluice_over_limit_cache_hits_total",
		"Rule decisions answered from the over-limit cache, with no store call.")
	m.overLimitEntries = gauge("sluice_over_limit_cache_entries",
		"Keys held in the over-limit cache.")
	m.hotKeys = gauge("sluice_hot_keys",
		"Keys currently counted on the local hot-key tier.")
	m.hotKeysDetected = counter("sluice_hot_keys_detected_total",
		"Keys that became hot (moved to the local hot-key tier).")
	m.hotKeySyncLag = hist("sluice_hot_key_sync_lag_seconds",
		"Time between successive successful batched syncs of hot keys' leases with the store: how stale a lease may be.",
		[]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5})
	m.hotKeySyncs = counter("sluice_hot_key_syncs_total",
		"Batched syncs of hot keys' local counts to the store.")
	m.storeGathered = hist("sluice_store_gathered_checks",
		"Checks decided by one store call of gathered checks (concurrent checks that waited for a call together).",
		[]float64{1, 2, 4, 8, 16, 32, 64, 128, 256})

	m.configInfo = gaugeVec(m, &cs, "sluice_config_info",
		"The configuration in force: 1 for its version, which is a label.", "version")
	m.reloadOK = gauge("sluice_config_last_reload_successful",
		"Whether the last attempt to load the configuration succeeded (1) or failed (0).")
	m.reloads = counterVec("sluice_config_reloads_total",
		"Attempts to load the configuration, by result (success, failure).", "result")
	m.reloadTime = hist("sluice_config_reload_duration_seconds",
		"Time to read, parse, validate and apply a configuration file.",
		[]float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1})
	m.reloadLastGood = gauge("sluice_config_last_reload_success_timestamp_seconds",
		"Unix time of the last configuration applied.")

	m.events = counterVec("sluice_events_total",
		"Audit events emitted, by type, before sampling.", "type")
	m.eventsSampled = counterVec("sluice_events_sampled_out_total",
		"Audit events the sampler kept from the log and the event ring, by type.", "type")

	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	empty := map[childKey]prometheus.Counter{}
	m.children.Store(&empty)
	return m, nil
}

func gaugeVec(m *Metrics, cs *[]prometheus.Collector, name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	m.names[name] = KindGauge
	*cs = append(*cs, g)
	return g
}

// Names returns the name and kind of every metric family New registers,
// for tools that check dashboards and alerting rules against them.
func (m *Metrics) Names() map[string]Kind {
	if m == nil {
		return nil
	}
	out := make(map[string]Kind, len(m.names))
	for k, v := range m.names {
		out[k] = v
	}
	return out
}

// child returns the counter of k, creating it on first use.
func (m *Metrics) child(k childKey) prometheus.Counter {
	if c, ok := (*m.children.Load())[k]; ok {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.children.Load()
	if c, ok := old[k]; ok {
		return c
	}
	var c prometheus.Counter
	switch k.fam {
	case famNearLimit:
		c = m.nearLimit.WithLabelValues(k.rule)
	case famEvents:
		c = m.events.WithLabelValues(k.rule)
	case famSampled:
		c = m.eventsSampled.WithLabelValues(k.rule)
	default:
		c = m.decisions.WithLabelValues(k.rule, k.result.String(), k.source)
	}
	next := make(map[childKey]prometheus.Counter, len(old)+1)
	for kk, v := range old {
		next[kk] = v
	}
	next[k] = c
	m.children.Store(&next)
	return c
}

// Decision counts the decision of rule (its id; "allow_list", "deny_list"
// or "none" for checks decided without a rule) with result, made by
// source (the engine's decision source name, such as "store").
func (m *Metrics) Decision(rule string, result Result, source string) {
	if m == nil {
		return
	}
	m.child(childKey{rule: rule, source: source, result: result}).Inc()
}

// NearLimit counts an admitted check of rule that left less than
// 1-NearLimitRatio of limit remaining; it does nothing otherwise (limit
// not positive, or enough remaining).
func (m *Metrics) NearLimit(rule string, limit, remaining int64) {
	if m == nil || limit <= 0 || float64(limit-remaining) <= NearLimitRatio*float64(limit) {
		return
	}
	m.child(childKey{rule: rule, fam: famNearLimit}).Inc()
}

// Check records one check through api that took d and ended in outcome.
func (m *Metrics) Check(api API, outcome Outcome, d time.Duration) {
	if m == nil || api >= numAPIs || outcome >= numOutcomes {
		return
	}
	m.checks[api][outcome].Inc()
	m.checkTime[api].Observe(d.Seconds())
}

// StoreCall records one store call of op that took d and returned err.
func (m *Metrics) StoreCall(op StoreOp, d time.Duration, err error) {
	if m == nil || op >= numStoreOps {
		return
	}
	m.storeTime[op].Observe(d.Seconds())
	if err != nil {
		m.storeErrors[op][KindOf(err)].Inc()
	}
}

// SetBreakerState records the breaker's state; call it on every change.
// A change of state also counts a transition.
func (m *Metrics) SetBreakerState(s BreakerState) {
	if m == nil {
		return
	}
	m.breakerState.state.Set(float64(s))
	to := "closed"
	switch s {
	case BreakerHalfOpen:
		to = "half_open"
	case BreakerOpen:
		to = "open"
	}
	m.breakerTransitions.WithLabelValues(to).Inc()
}

// RefreshBreakerState sets what is called before every collection of the
// breaker state gauge: a breaker that changes state lazily (open to
// half-open once its timeout has passed, seen only when asked) is asked,
// and reports the change through SetBreakerState, so that the gauge does
// not hold a state the breaker has left while no check came to ask it.
func (m *Metrics) RefreshBreakerState(refresh func()) {
	if m == nil {
		return
	}
	m.breakerState.refresh.Store(&refresh)
}

// breakerCollector collects the breaker's state gauge and transitions,
// after calling refresh, when set.
type breakerCollector struct {
	state       prometheus.Gauge
	transitions *prometheus.CounterVec // to
	refresh     atomic.Pointer[func()]
}

// Describe implements prometheus.Collector.
func (b *breakerCollector) Describe(ch chan<- *prometheus.Desc) {
	b.state.Describe(ch)
	b.transitions.Describe(ch)
}

// Collect implements prometheus.Collector.
func (b *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	if f := b.refresh.Load(); f != nil {
		(*f)()
	}
	b.state.Collect(ch)
	b.transitions.Collect(ch)
}

// FallbackReasons are the values of the reason label of
// sluice_store_fallbacks_total, exported at 0 from the start.
var FallbackReasons = []string{"unreachable", "stalled", "deadline", "breaker_open", "overloaded"}

// StoreFallback counts a rule decision taken without the store, for
// reason (one of FallbackReasons), by the failure mode mode (local,
// fail_open, fail_closed).
func (m *Metrics) StoreFallback(reason, mode string) {
	if m == nil {
		return
	}
	m.storeFallbacks.WithLabelValues(reason, mode).Inc()
}

// OverLimitCacheHit counts a rule decision answered from the over-limit
// cache without a store call.
func (m *Metrics) OverLimitCacheHit() {
	if m == nil {
		return
	}
	m.overLimitHits.Inc()
}

// SetOverLimitCacheEntries records the number of keys in the over-limit
// cache.
func (m *Metrics) SetOverLimitCacheEntries(n int) {
	if m == nil {
		return
	}
	m.overLimitEntries.Set(float64(n))
}

// SetHotKeys records the number of keys on the local hot-key tier.
func (m *Metrics) SetHotKeys(n int) {
	if m == nil {
		return
	}
	m.hotKeys.Set(float64(n))
}

// HotKeyDetected counts a key that became hot.
func (m *Metrics) HotKeyDetected() {
	if m == nil {
		return
	}
	m.hotKeysDetected.Inc()
}

// HotKeySync records one successful batched sync of hot keys' leases with
// the store: lag is the time since the previous successful one.
func (m *Metrics) HotKeySync(lag time.Duration) {
	if m == nil {
		return
	}
	m.hotKeySyncs.Inc()
	m.hotKeySyncLag.Observe(lag.Seconds())
}

// StoreGathered records one store call that decided n gathered checks.
func (m *Metrics) StoreGathered(n int) {
	if m == nil {
		return
	}
	m.storeGathered.Observe(float64(n))
}

// ConfigApplied records a configuration applied at t with version, after a
// load that took d.
func (m *Metrics) ConfigApplied(version string, t time.Time, d time.Duration) {
	if m == nil {
		return
	}
	m.mu.Lock()
	if m.version != version {
		if m.version != "" {
			m.configInfo.DeleteLabelValues(m.version)
		}
		m.version = version
	}
	m.configInfo.WithLabelValues(version).Set(1)
	m.mu.Unlock()
	m.reloadOK.Set(1)
	m.reloads.WithLabelValues("success").Inc()
	m.reloadLastGood.Set(float64(t.UnixNano()) / 1e9)
	if d > 0 {
		m.reloadTime.Observe(d.Seconds())
	}
}

// ConfigFailed records a failed attempt to load the configuration.
func (m *Metrics) ConfigFailed() {
	if m == nil {
		return
	}
	m.reloadOK.Set(0)
	m.reloads.WithLabelValues("failure").Inc()
}

// Event counts an audit event of type typ; sampledOut reports that the
// sampler kept it from the sinks.
func (m *Metrics) Event(typ string, sampledOut bool) {
	if m == nil {
		return
	}
	m.child(childKey{rule: typ, fam: famEvents}).Inc()
	if sampledOut {
		m.child(childKey{rule: typ, fam: famSampled}).Inc()
	}
}
