// Package engine decides checks: it turns a check into the limits of the
// policy rules that match it, runs them against the store in one round trip,
// and applies the failure mode of each rule when the store cannot answer.
//
// # What is consumed when
//
// Every rule that matches a check applies, and the check is allowed only
// when all of them allow it. The enforcing (non-shadow) rules of a check
// go to the store in one all-or-nothing call (a store.Batch with All set):
// when any of them denies, none of them consumes anything. On the memory store and on a single Redis this
// holds exactly. On Redis Cluster it holds exactly for the rules whose keys
// share a hash tag (the rules counting by one identity: see the key format
// in package policy); what the Redis store does for keys spread over slots
// is written in its documentation.
//
// Shadow rules are decided after the enforcing ones, in a second store
// call, each on its own: when the check was allowed they are charged the
// check's cost (and count exactly the traffic that went through, as they
// would if enforced); when it was denied they are only read (cost 0).
// They never deny; Result.ShadowDenied reports that one would have.
//
// Allow-listed identities are never limited and consume nothing;
// deny-listed ones are always denied and consume nothing. A check that no
// rule matches is allowed and consumes nothing.
package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/keyspace"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/share"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// This file holds the Engine, its configuration and its entry point Check;
// batch.go holds BatchCheck and BatchCheckInto. A check is decided in three steps, each in the file of
// its name: plan.go (the policy turns the check into items, with their
// keys and costs), decide.go (the store call and the failure modes) and
// answer.go (the Result, with the rule and source that decided it). A
// transport that resolves its requests into limits itself (Envoy's, in
// internal/envoyrls) has them decided by the same decide step (limits.go).

// ErrInvalidCheck is wrapped by every error about a malformed check; the
// error is a *FieldError that names the field.
var ErrInvalidCheck = errors.New("sluice: invalid check")

// FieldError reports a bad value in one field of a check. Transports map it
// to HTTP 400 and gRPC InvalidArgument, naming Field.
type FieldError struct {
	// Field is the wire name of the field, such as "client_id".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error.
func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Unwrap makes errors.Is(err, ErrInvalidCheck) hold.
func (e *FieldError) Unwrap() error { return ErrInvalidCheck }

// Store is what the engine needs of a storage back end: the one interface
// of package store, which states the contract. *memory.Store, *redis.Store
// and the guard of internal/guard implement it. The engine calls only its
// Do, Reset and Info: when Info().SharedRecords is set, it hands the store
// the idempotency keys of its checks (Batch.Once) instead of remembering
// them in process; it reports the sources a decorator writes to
// Batch.Sources in its results.
type Store = store.Store

// Config holds the engine's knobs.
type Config struct {
	// Store keeps the limits' state. Required.
	Store Store
	// Policy is the initial policy. Required.
	Policy *policy.Policy
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Metrics receives the engine's metrics (decisions, check and store
	// latency); nil records none.
	Metrics *metrics.Metrics
	// Events receives the audit events of denials and bursts; nil emits
	// none.
	Events *events.Recorder
	// IdempotencyTTL is how long a decision is remembered for its
	// idempotency key; zero means 5 minutes.
	IdempotencyTTL time.Duration
	// MaxIdempotencyKeys bounds the idempotency keys remembered in
	// process; zero means 1,000,000. Beyond it, new keys are decided
	// without being remembered until expired records make room. Expired
	// records are swept by a background goroutine every tenth of
	// IdempotencyTTL (stopped by Engine.Close), and as new ones arrive.
	MaxIdempotencyKeys int
	// Local is the in-process limiter that decides the rules whose
	// failure mode is local while Store cannot answer, with each rule's
	// share of its limit. Nil means a new memory store of LocalMaxKeys
	// keys.
	Local Store
	// LocalMaxKeys bounds the keys of the default Local limiter; zero
	// means 65,536.
	LocalMaxKeys int
	// MaybeCountedFailsClosed fails the local rules of a check closed
	// when its store call was given up on after it was sent (the error
	// wraps store.ErrMaybeCounted): the store may count it, and admitted
	// locally too it would pass the limit. The service sets it; off, such
	// a check is decided by Local like any other.
	MaybeCountedFailsClosed bool
	// Global is the region's view of the other regions' consumption of
	// global limits. Nil decides them as if this region were alone.
	Global GlobalView
	// Analytics receives one event per decision (a check, each check of a
	// batch, an Envoy call); nil records none. Record is called on the
	// check path, so it must neither block nor allocate.
	Analytics Analytics
	// Region is the region named in the analytics events; empty means
	// "local".
	Region string
	// Tracer makes a span per check, batch and Envoy call, and a child
	// span per store call (see trace.go); nil traces nothing. The engine
	// samples before it calls Tracer (see TraceSampleRatio), so its
	// sampler should sample every span it is asked for
	// (sdktrace.ParentBased(sdktrace.AlwaysSample())).
	Tracer trace.Tracer
	// TraceSampleRatio is the share, from 0 to 1, of the checks traced
	// among those whose context carries no span; a check whose context
	// carries one is traced when that span is sampled, as
	// ParentBased(TraceIDRatioBased) samples. Zero traces only the
	// checks of sampled callers.
	TraceSampleRatio float64
	// BulkShare is the share of the time and of the CPUs, above 0 and at
	// most 1, that requests of more than BulkChecks checks (batches,
	// Envoy calls) may take while they contend with smaller ones: while
	// smaller ones are in progress (or were in the last 10ms), they wait
	// between slices of their work, so that one client's large batches do
	// not slow every other client's checks (see package share). They are
	// never refused, their decisions never change, and they never wait
	// past half of the time their context had left. Zero means 0.1; 1
	// turns the bound off.
	BulkShare float64
	// BulkChecks is the most checks (or Envoy descriptors) of a request
	// that BulkShare leaves alone; zero means 16.
	BulkChecks int
}

// Analytics is what the engine needs of an analytics recorder.
// *analytics.Recorder implements it.
type Analytics interface {
	// Record takes one decision; it must return at once.
	Record(ev analytics.Event)
}

// Engine decides checks. It is safe for concurrent use.
type Engine struct {
	store  Store
	shared bool  // store keeps idempotency records (Info().SharedRecords)
	local  Store // the failure_mode local limiter
	// maybeClosed is Config.MaybeCountedFailsClosed.
	maybeClosed bool
	now         func() time.Time
	policy      atomic.Pointer[policy.Policy]
	idem        *idemCache
	ttl         time.Duration // of idempotency keys
	pool        sync.Pool     // *scratch

	// metrics and events are optional (nil-safe); see observe.go.
	metrics *metrics.Metrics
	events  *events.Recorder

	global GlobalView // nil: global limits decided as if alone

	analytics Analytics // nil: no analytics
	region    string    // of the analytics events

	tracer trace.Tracer // nil: no tracing
	ratio  float64      // of the checks without a caller's span traced

	share *share.Gate // nil: requests of many checks not held back

	// maxAtomic bounds the store work of an all-or-nothing call of
	// several checks (Info().MaxAtomicWork; 0: no bound); see fitsAtomic.
	maxAtomic int
}

// New returns an engine for cfg.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil {
		return nil, errors.New("engine: config: store is required")
	}
	if cfg.Policy == nil {
		return nil, errors.New("engine: config: policy is required")
	}
	if cfg.IdempotencyTTL < 0 {
		return nil, fmt.Errorf("engine: config: idempotency TTL must not be negative, got %s", cfg.IdempotencyTTL)
	}
	e := &Engine{store: observeStore(traceStore(cfg.Store, cfg.Tracer), cfg.Metrics), shared: cfg.Store.Info().SharedRecords,
		now: cfg.Now, metrics: cfg.Metrics, events: cfg.Events, global: cfg.Global,
		analytics: cfg.Analytics, region: cfg.Region, tracer: cfg.Tracer, ratio: cfg.TraceSampleRatio}
	if cfg.BulkShare < 0 || cfg.BulkChecks < 0 {
		return nil, fmt.Errorf("engine: config: bulk share and checks must not be negative, got %g and %d", cfg.BulkShare, cfg.BulkChecks)
	}
	e.share = share.New(share.Config{Share: cfg.BulkShare, BulkChecks: cfg.BulkChecks})
	e.maxAtomic = cfg.Store.Info().MaxAtomicWork
	if e.region == "" {
		e.region = "local"
	}
	if e.now == nil {
		e.now = time.Now
	}
	ttl := cfg.IdempotencyTTL
	if ttl == 0 {
		ttl = 5 * time.Minute
	}
	maxIdem := cfg.MaxIdempotencyKeys
	if maxIdem <= 0 {
		maxIdem = 1_000_000
	}
	e.idem = newIdemCache(ttl, maxIdem, e.now)
	e.ttl = ttl
	e.local = cfg.Local
	e.maybeClosed = cfg.MaybeCountedFailsClosed
	if e.local == nil {
		localKeys := cfg.LocalMaxKeys
		if localKeys <= 0 {
			localKeys = 1 << 16
		}
		local, err := memory.New(memory.Config{MaxKeys: localKeys, Now: e.now})
		if err != nil {
			return nil, fmt.Errorf("engine: local limiter: %w", err)
		}
		e.local = local
	}
	if err := e.Accepts(cfg.Policy); err != nil {
		return nil, err
	}
	e.policy.Store(cfg.Policy)
	e.pool.New = func() any { return new(scratch) }
	return e, nil
}

// Accepts reports whether the store, and the in-process limiter of the
// local failure mode, can decide every limit of p (see store.Info.Accepts):
// nil when they can. Call it before ApplyPolicy to refuse a policy the
// store would fail on at every check.
//
// The policy package compiles every limit and keeps sliding window logs
// within policy.MaxLogLimit, so a store whose bound is that or more
// decides them all, and is not asked limit by limit: walking the limits of
// a policy of 100,000 overrides would cost more than applying one change
// to it.
func (e *Engine) Accepts(p *policy.Policy) error {
	for _, st := range []Store{e.store, e.local} {
		info := st.Info()
		if info.MaxLogEntries <= 0 || info.MaxLogEntries >= policy.MaxLogLimit {
			continue
		}
		for _, l := range p.Limits() {
			for i := range l.Params {
				if err := info.Accepts(&l.Params[i]); err != nil {
					return fmt.Errorf("engine: policy %s: %w", p.Version, err)
				}
			}
		}
	}
	return nil
}

// Close stops the engine's background work (the sweep of expired
// idempotency records) and waits for it. It does not close the stores.
// Checks after Close are still decided; their idempotency records are
// then swept only as new ones arrive. Calling it again does nothing.
func (e *Engine) Close() error {
	e.idem.close()
	return nil
}

// ApplyPolicy swaps in p atomically; checks already running finish on the
// policy they started with. A nil p is ignored.
func (e *Engine) ApplyPolicy(p *policy.Policy) {
	if p != nil {
		e.policy.Store(p)
	}
}

// Policy returns the policy in force.
func (e *Engine) Policy() *policy.Policy { return e.policy.Load() }

// Now returns the time on the engine's clock (Config.Now).
func (e *Engine) Now() time.Time { return e.now() }

// Ready reports whether the store decides checks: it charges one unit to
// a key of its own, under a limit no probe reaches, which expires within
// seconds. A read alone would not do: a store that answers but cannot
// write (Redis out of memory under noeviction, a read-only replica) fails
// every check that counts.
func (e *Engine) Ready(ctx context.Context) error {
	reqs := [1]store.Request{{Key: keyspace.ReadyKey, Params: &readyParams, Cost: 1}}
	var out [1]sluice.Decision
	return e.store.Do(ctx, &store.Batch{Reqs: reqs[:], Out: out[:]})
}

var readyParams = algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1 << 40, Window: time.Second})

// Check decides one check. Its error wraps ErrInvalidCheck for bad input;
// store failures are handled by each rule's failure mode and show in the
// Result, not as an error.
//
// A check with an IdempotencyKey that the engine has already decided for
// the same client, on the same counters (the store keys of the rules that
// apply), within the idempotency TTL returns the first decision (with
// Source SourceIdempotent) and charges nothing. The key on other counters
// (another resource, another user) is another request: it is decided and
// charged, and the first one's record stays. Concurrent checks with one
// key wait for the first.
func (e *Engine) Check(ctx context.Context, c *Check) (res Result, err error) {
	small := e.share.StartSmall()
	if e.tracer != nil && e.sampled(ctx) {
		res, err = e.tracedCheck(ctx, c)
	} else {
		res, err = e.observedCheck(ctx, c)
	}
	e.share.EndSmall(small)
	return res, err
}

// observedCheck is Check, untraced.
func (e *Engine) observedCheck(ctx context.Context, c *Check) (Result, error) {
	if !e.observing() {
		return e.decide(ctx, c)
	}
	start := time.Now()
	res, err := e.decide(ctx, c)
	e.observeCheck(ctx, metrics.APICheck, start, c, &res, err)
	return res, err
}

// decide is Check, unobserved.
func (e *Engine) decide(ctx context.Context, c *Check) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	return e.check(ctx, e.policy.Load(), c)
}

func (e *Engine) check(ctx context.Context, p *policy.Policy, c *Check) (Result, error) {
	return e.checkIn(ctx, p, c, nil)
}

// checkIn is check; rules, when not nil, is memory the check's rule
// results may be appended to (those of a best-effort batch's answer),
// unless the result is kept in process for its idempotency key.
func (e *Engine) checkIn(ctx context.Context, p *policy.Policy, c *Check, rules *[]RuleResult) (Result, error) {
	q := request(c)
	if r, ok := listed(p, &q); ok {
		return r, nil
	}
	s := e.getScratch()
	defer e.putScratch(s)
	if err := e.plan(s, p, c, &q, 0, ""); err != nil {
		return Result{}, err
	}
	if len(s.items) == 0 {
		return Result{Allowed: true, Source: SourceNoRule, Deciding: RuleResult{Allowed: true, Source: SourceNoRule}}, nil
	}
	e.finishKeys(s)
	if c.IdempotencyKey != "" {
		// A key is one request's only on the counters it was first
		// checked on: the same key on other counters is another request.
		h := counters(s.items)
		if !e.shared {
			return e.idem.do(ctx, e.clock(c), newIdemKey(c.ClientID, c.IdempotencyKey, h), func() (Result, error) {
				return e.decideItems(ctx, s, c, nil), nil
			})
		}
		s.idemKey = keyspace.Idempotency(c.ClientID, c.IdempotencyKey, h)
	}
	return e.decideItems(ctx, s, c, rules), nil
}

// decideItems decides the planned items of the check c and assembles its
// result, its rule results appended to rules when not nil.
func (e *Engine) decideItems(ctx context.Context, s *scratch, c *Check, rules *[]RuleResult) Result {
	allowed := e.run(ctx, s, c.Now, true)
	var res Result
	if rules == nil {
		res = assemble(s.items, allowed)
	} else {
		n, m := len(*rules), len(s.items)
		*rules = slices.Grow(*rules, m)[:n+m]
		res = assembleIn((*rules)[n:n+m:n+m], s.items, allowed)
	}
	if s.replayed {
		res.Source = SourceIdempotent
	}
	return res
}
