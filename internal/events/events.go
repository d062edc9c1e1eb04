// Package events records Sluice's audit events: checks denied,
// bursts detected, configuration applied or rejected, allow and deny list
// changes. A Recorder counts every event, samples the high-volume ones and
// hands the rest to its sinks: by default the structured log and a bounded
// ring of the last events, which the HTTP API serves at GET /api/v1/events.
//
// # Burst detection
//
// A key (one rule applied to one identity) that is denied BurstWarn times
// within one BurstWindow (aligned on the Unix epoch) emits
// burst_detected_warning; denied BurstBlock times within the same window, it
// emits burst_detected_blocked. Each is emitted at most once per key and
// window. The defaults are 20 and 100 denials in 10 s. The detector tracks
// at most BurstMaxKeys keys per window (beyond them new keys are not
// tracked until the next window), so its memory is bounded. Detection
// reports; it adds no penalty of its own: the key's rule is already denying
// it.
//
// # Sampling
//
// rate_limit_exceeded, burst_detected_warning and burst_detected_blocked
// are sampled per type: in each second the first SampleFirst events reach
// the sinks, then one in SampleThereafter. Every event is counted in
// sluice_events_total before sampling, so the metric is exact. Every other
// type reaches the sinks whole.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/logging"
	"github.com/sluicehq/sluice/internal/metrics"
)

// Type names an event type, as it appears in logs and in the JSON of GET
// /api/v1/events.
type Type string

// The event types.
const (
	// RateLimitExceeded: a check was denied by a rule.
	RateLimitExceeded Type = "rate_limit_exceeded"
	// BurstWarning: a key was denied BurstWarn times within a window.
	BurstWarning Type = "burst_detected_warning"
	// BurstBlocked: a key was denied BurstBlock times within a window.
	BurstBlocked Type = "burst_detected_blocked"
	// ConfigUpdated: a configuration was applied (at start and on reload).
	ConfigUpdated Type = "rate_limit_config_updated"
	// ConfigRejected: a configuration failed to load; the one in force
	// stays.
	ConfigRejected Type = "rate_limit_config_rejected"
	// AllowListAdded and AllowListRemoved: an identity joined or left the
	// allow list on reload.
	AllowListAdded   Type = "rate_limit_allow_list_added"
	AllowListRemoved Type = "rate_limit_allow_list_removed"
	// DenyListAdded and DenyListRemoved: the same for the deny list.
	DenyListAdded   Type = "rate_limit_deny_list_added"
	DenyListRemoved Type = "rate_limit_deny_list_removed"
	// StoreFallback: a check was decided without the store, by its
	// rule's failure mode (source local, fail_open or fail_closed), for
	// the reason in Reason.
	StoreFallback Type = "store_fallback"
	// ControlChange: an object of the control plane (a rule, an
	// identity's tier, an override, a throttle, a config, a token) was
	// changed through this instance: Actor and Role say who, Action what
	// (create, update, delete, rollback, lift), Object and ObjectID which
	// object, Reason why, Revision at which revision of the store.
	ControlChange Type = "control_plane_change"
	// ReservationGranted: a reservation of capacity was granted, at once
	// or from the queue: Reservation, Tokens (granted), ClientID,
	// Resource and Rule (the pool's).
	ReservationGranted Type = "reservation_granted"
	// ReservationReleased: a reservation was released by its client;
	// Tokens is what it returned (the part not used).
	ReservationReleased Type = "reservation_released"
	// ReservationExpired: a reservation reached its expiry; Tokens is
	// what it still held and returned to the pool.
	ReservationExpired Type = "reservation_expired"
)

// Severities of events.
const (
	SeverityInfo    = "info"
	SeverityWarning = "warning"
	SeverityError   = "error"
)

// Event is one audit event. Fields that do not apply to its type are
// empty.
type Event struct {
	// Type is what happened.
	Type Type `json:"type"`
	// Time is when, at the engine's clock.
	Time time.Time `json:"time"`
	// Severity is info, warning or error.
	Severity string `json:"severity"`
	// Rule is the rule id (the descriptor key for Envoy limits).
	Rule string `json:"rule,omitempty"`
	// Key is the store key of the rule and identity.
	Key string `json:"key,omitempty"`
	// ClientID, User, IP and APIKey identify the caller. APIKey is the
	// key's fingerprint (see Fingerprint), never the key: the events reach
	// the log and GET /api/v1/events, which any caller can read.
	ClientID string `json:"client_id,omitempty"`
	User     string `json:"user,omitempty"`
	IP       string `json:"ip,omitempty"`
	APIKey   string `json:"api_key,omitempty"`
	// Resource is the checked resource; Domain the Envoy domain.
	Resource string `json:"resource,omitempty"`
	Domain   string `json:"domain,omitempty"`
	// Tier is the tier whose limit applied.
	Tier string `json:"tier,omitempty"`
	// Source is the decision source, such as "store".
	Source string `json:"source,omitempty"`
	// Reason says why a store_fallback event's check was decided
	// without the store: unreachable, stalled, deadline, breaker_open or
	// overloaded.
	Reason string `json:"reason,omitempty"`
	// Limit is the limit that denied.
	Limit int64 `json:"limit,omitempty"`
	// RetryAfterMS is the retry-after of a denial, in milliseconds.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
	// Count is the number of denials within the window, for burst events.
	Count int64 `json:"count,omitempty"`
	// Reservation is the id of a reservation, for the reservation
	// events; Tokens the tokens it was granted or returned.
	Reservation string `json:"reservation_id,omitempty"`
	Tokens      int64  `json:"tokens,omitempty"`
	// WindowMS is the burst window, in milliseconds.
	WindowMS int64 `json:"window_ms,omitempty"`
	// Version and PreviousVersion are configuration versions.
	Version         string `json:"version,omitempty"`
	PreviousVersion string `json:"previous_version,omitempty"`
	// Path is the configuration file.
	Path string `json:"path,omitempty"`
	// Identity is the list entry, such as "client:vip" or "ip:10.0.0.0/8".
	Identity string `json:"identity,omitempty"`
	// Error is the error of a rejected configuration.
	Error string `json:"error,omitempty"`
	// Actor and Role are the admin token's name and role of a control
	// plane change; Action, Object and ObjectID what it changed, at
	// Revision.
	Actor    string `json:"actor,omitempty"`
	Role     string `json:"role,omitempty"`
	Action   string `json:"action,omitempty"`
	Object   string `json:"object,omitempty"`
	ObjectID string `json:"object_id,omitempty"`
	Revision int64  `json:"revision,omitempty"`
	// RequestID is the request id of the request the event arose from
	// (see logging.RequestID): the id its caller sent, or one made at
	// debug level. Events of no request (configuration, lists) have none.
	RequestID string `json:"request_id,omitempty"`
}

// Sink receives events. Emit must not block for long (it runs on the
// check's path) and must be safe for concurrent use; it must not keep ev.
type Sink interface {
	Emit(ev *Event)
}

// Denial describes a check a rule denied, for Recorder.Denied: the
// deciding rule (its id, tier and decision source), the store key when the
// caller knows it (Envoy), the caller's identities, the resource or Envoy
// domain, and the rule's limit and retry-after. The fields become those
// of the rate_limit_exceeded event.
type Denial struct {
	Rule, Key, Tier, Source    string
	Reason                     string // of a fallback (Recorder.Fallback)
	ClientID, User, IP, APIKey string
	Resource, Domain           string
	Limit                      int64
	RetryAfter                 time.Duration
}

// Config configures a Recorder. The zero value uses the defaults.
type Config struct {
	// Sinks receive the events that pass sampling, in order.
	Sinks []Sink
	// Metrics counts events; nil counts nothing.
	Metrics *metrics.Metrics
	// SampleFirst and SampleThereafter tune the sampling of the
	// high-volume types: per type and second, the first SampleFirst pass,
	// then one in SampleThereafter. Zero means 10 and 100; a negative
	// SampleFirst turns sampling off.
	SampleFirst, SampleThereafter int
	// BurstWindow, BurstWarn and BurstBlock set the burst rule; zero
	// means 10s, 20 and 100. A negative BurstWarn turns detection off.
	BurstWindow           time.Duration
	BurstWarn, BurstBlock int
	// BurstMaxKeys bounds the keys tracked per window; zero means 65,536.
	BurstMaxKeys int
}

// Recorder records events. A nil *Recorder accepts every call and records
// nothing. It is safe for concurrent use.
type Recorder struct {
	sinks    []Sink
	m        *metrics.Metrics
	first    int64
	after    int64
	samplers [4]sampler // by highVolume index
	burst    *burstDetector
}

// New returns a recorder for cfg.
func New(cfg Config) *Recorder {
	r := &Recorder{sinks: cfg.Sinks, m: cfg.Metrics, first: int64(cfg.SampleFirst), after: int64(cfg.SampleThereafter)}
	if r.first == 0 {
		r.first = 10
	}
	if r.after <= 0 {
		r.after = 100
	}
	if cfg.BurstWarn >= 0 {
		r.burst = newBurstDetector(cfg)
	}
	return r
}

// highVolume returns the sampler index of t, or -1 when t is not sampled.
func highVolume(t Type) int {
	switch t {
	case RateLimitExceeded:
		return 0
	case BurstWarning:
		return 1
	case BurstBlocked:
		return 2
	case StoreFallback:
		return 3
	}
	return -1
}

// sampler lets through, per second, the first events and then one in n.
type sampler struct {
	sec   atomic.Int64
	count atomic.Int64
}

func (s *sampler) pass(now time.Time, first, after int64) bool {
	sec := now.Unix()
	if old := s.sec.Load(); old != sec && s.sec.CompareAndSwap(old, sec) {
		s.count.Store(0)
	}
	n := s.count.Add(1)
	return n <= first || (n-first)%after == 0
}

// sampled reports whether an event of type t at now passes sampling.
func (r *Recorder) sampled(t Type, now time.Time) bool {
	i := highVolume(t)
	if i < 0 || r.first < 0 {
		return true
	}
	return r.samplers[i].pass(now, r.first, r.after)
}

// Emit records ev: counts it, samples it when its type is high-volume,
// and hands it to the sinks.
func (r *Recorder) Emit(ev Event) {
	if r == nil {
		return
	}
	pass := r.sampled(ev.Type, ev.Time)
	r.m.Event(string(ev.Type), !pass)
	if pass {
		r.deliver(ev)
	}
}

// deliver hands ev to the sinks; only events that pass sampling get here,
// so only they are copied to the heap.
func (r *Recorder) deliver(ev Event) {
	for _, s := range r.sinks {
		s.Emit(&ev)
	}
}

// Denied records a denial at now of the request whose context is ctx: a
// rate_limit_exceeded event, and the burst events when the key crosses a
// threshold of the burst rule. The events carry the request id ctx holds;
// it is read only for the events that reach the sinks.
func (r *Recorder) Denied(ctx context.Context, now time.Time, d *Denial) {
	if r == nil {
		return
	}
	pass := r.sampled(RateLimitExceeded, now)
	r.m.Event(string(RateLimitExceeded), !pass)
	if pass {
		r.deliver(denialEvent(ctx, RateLimitExceeded, SeverityWarning, now, d))
	}
	if r.burst == nil {
		return
	}
	switch n, crossed := r.burst.denied(now, d); crossed {
	case BurstWarning:
		ev := denialEvent(ctx, BurstWarning, SeverityWarning, now, d)
		ev.Count, ev.WindowMS = n, r.burst.window.Milliseconds()
		r.Emit(ev)
	case BurstBlocked:
		ev := denialEvent(ctx, BurstBlocked, SeverityError, now, d)
		ev.Count, ev.WindowMS = n, r.burst.window.Milliseconds()
		r.Emit(ev)
	}
}

// Fallback records at now a check of the request whose context is ctx
// that was decided without the store: a store_fallback event, sampled as
// denials are, naming the deciding rule, its source (local, fail_open,
// fail_closed) and the reason (d.Reason).
func (r *Recorder) Fallback(ctx context.Context, now time.Time, d *Denial) {
	if r == nil {
		return
	}
	pass := r.sampled(StoreFallback, now)
	r.m.Event(string(StoreFallback), !pass)
	if pass {
		r.deliver(denialEvent(ctx, StoreFallback, SeverityWarning, now, d))
	}
}

func denialEvent(ctx context.Context, t Type, sev string, now time.Time, d *Denial) Event {
	return Event{Type: t, Time: now, Severity: sev, Rule: d.Rule, Key: d.Key, Tier: d.Tier, Source: d.Source, Reason: d.Reason,
		ClientID: d.ClientID, User: d.User, IP: d.IP, APIKey: Fingerprint(d.APIKey), Resource: d.Resource, Domain: d.Domain,
		Limit: d.Limit, RetryAfterMS: d.RetryAfter.Milliseconds(), RequestID: logging.RequestID(ctx)}
}

// Fingerprint returns what events show of an API key: "sha256:" and the
// first 16 hex digits of the key's SHA-256, which tells keys apart and
// matches a key an operator hashes, without disclosing it; "" for "".
func Fingerprint(apiKey string) string {
	if apiKey == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(apiKey))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// burstDetector counts denials per key in fixed windows, in shards.
type burstDetector struct {
	window      time.Duration
	warn, block int64
	maxPerShard int
	shards      [16]burstShard
}

// burstKey identifies what the burst rule counts: one rule applied to one
// caller (its store key when the caller knows it, else its identities).
type burstKey struct {
	rule, key, client, user, ip, apiKey string
}

type burstShard struct {
	mu sync.Mutex
	// start and counts are guarded by mu.
	start  int64 // window index
	counts map[burstKey]int64
}

func newBurstDetector(cfg Config) *burstDetector {
	b := &burstDetector{window: cfg.BurstWindow, warn: int64(cfg.BurstWarn), block: int64(cfg.BurstBlock)}
	if b.window <= 0 {
		b.window = 10 * time.Second
	}
	if b.warn == 0 {
		b.warn = 20
	}
	if b.block <= 0 {
		b.block = 100
	}
	maxKeys := cfg.BurstMaxKeys
	if maxKeys <= 0 {
		maxKeys = 1 << 16
	}
	b.maxPerShard = max(1, maxKeys/len(b.shards))
	for i := range b.shards {
		b.shards[i].counts = map[burstKey]int64{}
	}
	return b
}

// denied counts a denial d at now and returns the count of its key in the
// window and the burst event type it crossed into, if any.
func (b *burstDetector) denied(now time.Time, d *Denial) (int64, Type) {
	key := burstKey{rule: d.Rule, key: d.Key, client: d.ClientID, user: d.User, ip: d.IP, apiKey: d.APIKey}
	h := uint32(2166136261)
	for _, part := range [...]string{d.Rule, d.Key, d.ClientID, d.User, d.IP, d.APIKey} {
		for i := 0; i < len(part); i++ {
			h = (h ^ uint32(part[i])) * 16777619
		}
		h = (h ^ 0xff) * 16777619
	}
	s := &b.shards[h%uint32(len(b.shards))]
	w := now.UnixNano() / int64(b.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if w != s.start {
		clear(s.counts)
		s.start = w
	}
	n, ok := s.counts[key]
	if !ok && len(s.counts) >= b.maxPerShard {
		return 0, ""
	}
	n++
	s.counts[key] = n
	switch n {
	case b.warn:
		return n, BurstWarning
	case b.block:
		return n, BurstBlocked
	}
	return n, ""
}

// Ring keeps the last events in a bounded buffer. It is a Sink, safe for
// concurrent use.
type Ring struct {
	mu sync.Mutex
	// buf, next and total are guarded by mu.
	buf   []Event
	next  int
	total int64
}

// NewRing returns a ring holding the last n events (1000 when n <= 0).
func NewRing(n int) *Ring {
	if n <= 0 {
		n = 1000
	}
	return &Ring{buf: make([]Event, 0, n)}
}

// Emit stores a copy of ev, dropping the oldest event when full.
func (r *Ring) Emit(ev *Event) {
	r.mu.Lock()
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, *ev)
	} else {
		r.buf[r.next] = *ev
	}
	r.next = (r.next + 1) % cap(r.buf)
	r.total++
	r.mu.Unlock()
}

// Last returns up to n events, newest first, keeping those for which keep
// returns true (all when keep is nil), and the number of events the ring
// has received since it was made.
func (r *Ring) Last(n int, keep func(*Event) bool) (evs []Event, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	size := len(r.buf)
	for i := 1; i <= size && len(evs) < n; i++ {
		ev := &r.buf[(r.next-i+size)%size]
		if keep == nil || keep(ev) {
			evs = append(evs, *ev)
		}
	}
	return evs, r.total
}

// Capacity returns the most events the ring holds.
func (r *Ring) Capacity() int {
	// Under mu: Emit's append writes the slice header.
	r.mu.Lock()
	defer r.mu.Unlock()
	return cap(r.buf)
}

// LogSink writes events to a structured logger, one line each, at the
// level of their severity. It is a Sink.
type LogSink struct {
	log *slog.Logger
}

// NewLogSink returns a sink writing to log.
func NewLogSink(log *slog.Logger) *LogSink { return &LogSink{log: log} }

// Emit logs ev.
func (s *LogSink) Emit(ev *Event) {
	level := slog.LevelInfo
	switch ev.Severity {
	case SeverityWarning:
		level = slog.LevelWarn
	case SeverityError:
		level = slog.LevelError
	}
	ctx := context.Background()
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs, slog.String("event", string(ev.Type)))
	str := func(k, v string) {
		if v != "" {
			attrs = append(attrs, slog.String(k, v))
		}
	}
	num := func(k string, v int64) {
		if v != 0 {
			attrs = append(attrs, slog.Int64(k, v))
		}
	}
	str("rule", ev.Rule)
	str("key", ev.Key)
	str("client_id", ev.ClientID)
	str("user", ev.User)
	str("ip", ev.IP)
	str("api_key", ev.APIKey)
	str("resource", ev.Resource)
	str("domain", ev.Domain)
	str("tier", ev.Tier)
	str("source", ev.Source)
	num("limit", ev.Limit)
	num("retry_after_ms", ev.RetryAfterMS)
	num("count", ev.Count)
	num("window_ms", ev.WindowMS)
	str("version", ev.Version)
	str("previous_version", ev.PreviousVersion)
	str("path", ev.Path)
	str("identity", ev.Identity)
	str("error", ev.Error)
	// The key of the request-scoped field of every other line about the
	// request (the sink has no context: the event carries the id).
	str(logging.RequestIDKey, ev.RequestID)
	s.log.LogAttrs(ctx, level, "audit event", attrs...)
}
