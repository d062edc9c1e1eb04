// Package engine decides checks: it turns a check into the limits of the
// policy rules that match it, runs them against the store in one round trip,
// and applies the failure mode of each rule when the store cannot answer.
//
// # What is consumed when
//
// Every rule that matches a check applies, and the check is allowed only
// when all of them allow it. The enforcing (non-shadow) rules of a check
// go to the store in one CheckAll call: when any of them denies, none of
// them consumes anything. On the memory store and on a single Redis this
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
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

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

// InBatch returns err, an error of the i-th check of a batch, with its
// field named with the check's index ("checks[2].cost"); other errors are
// returned as they are. Decoders call it on the error path, so that a
// batch's checks are validated without building names.
func InBatch(i int, err error) error {
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	return &FieldError{Field: "checks[" + strconv.Itoa(i) + "]." + fe.Field, Reason: fe.Reason}
}

// Bounds on the fields of a check.
const (
	// MaxIdentifierLen bounds client_id, user, ip, api_key, method,
	// operation and idempotency_key, in bytes.
	MaxIdentifierLen = 256
	// MaxResourceLen bounds resource, in bytes.
	MaxResourceLen = 2048
	// MaxEntryLen bounds the key and the value of an Envoy descriptor
	// entry, in bytes: 64 KiB, above Envoy's default limit on request
	// headers (60 KiB), which a descriptor's value may come from. Store
	// keys longer than policy.MaxKeyBytes are shortened.
	MaxEntryLen = 64 << 10
	// MaxCost bounds the cost of a check before multipliers.
	MaxCost = 1 << 30
	// MaxBatch bounds the checks of one batch.
	MaxBatch = 1000
)

// BatchMode says how a batch of checks is decided.
type BatchMode uint8

// The batch modes.
const (
	// AllOrNothing allows every check or consumes nothing.
	AllOrNothing BatchMode = iota + 1
	// BestEffort decides each check on its own.
	BestEffort
)

// Store is what the engine needs of a storage back end; see package store
// for the contract. *memory.Store and *redis.Store implement it.
type Store interface {
	Check(ctx context.Context, reqs []store.Request, out []sluice.Decision) error
	CheckAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error
	Reset(ctx context.Context, keys ...string) error
}

// IdempotentStore is implemented by stores that remember idempotency
// records for every instance sharing them, so that a repeated check is
// charged once across instances. When Config.Store implements it, the
// engine hands it the idempotency keys instead of remembering them in
// process.
//
// CheckAllOnce is CheckAll made idempotent by key, in one atomic step:
// when key has a record younger than ttl, nothing is decided or consumed,
// out is filled with the recorded decisions and replayed is true;
// otherwise reqs are decided exactly as by CheckAll and their decisions
// recorded under key for ttl (denials included: a repeat of a denied
// check is denied again without being decided).
type IdempotentStore interface {
	CheckAllOnce(ctx context.Context, key string, ttl time.Duration, reqs []store.Request, out []sluice.Decision) (replayed bool, err error)
}

// SourcedStore is implemented by store decorators that answer some
// requests in process (internal/guard: the over-limit cache and the
// hot-key tier). CheckSourced is Check (all false) or CheckAll (all true)
// that also writes to src[i] what decided reqs[i]: SourceStore,
// SourceOverLimitCache or SourceHotKey. When Config.Store implements it,
// the engine reports those sources in its results.
type SourcedStore interface {
	CheckSourced(ctx context.Context, all bool, reqs []store.Request, out []sluice.Decision, src []Source) error
}

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
	// EnvoyCompat decides Envoy descriptors as envoyproxy/ratelimit does
	// where Sluice differs (see ShouldRateLimit): each descriptor on its
	// own, refused hits counted on fixed windows, a descriptor with no
	// entries not limited.
	EnvoyCompat bool
}

// Engine decides checks. It is safe for concurrent use.
type Engine struct {
	store  Store
	local  Store // the failure_mode local limiter
	now    func() time.Time
	policy atomic.Pointer[policy.Policy]
	idem   *idemCache
	ttl    time.Duration // of idempotency keys
	pool   sync.Pool     // *scratch

	// metrics and events are optional (nil-safe); see observe.go.
	metrics *metrics.Metrics
	events  *events.Recorder

	envoyCompat bool
	compat      atomic.Pointer[compatParams] // with envoyCompat
}

// compatParams holds, for the policy pol, the Params of its Envoy limits
// as envoyCompat decides them (see envoyParams), by the Params they are
// made from.
type compatParams struct {
	pol *policy.Policy
	m   sync.Map // *algorithm.Params -> *algorithm.Params
}

// envoyParams returns the Params an Envoy limit of p is decided with:
// p itself, or with EnvoyCompat, for a fixed window, p counting the hits
// it refuses, and a limit of 0 counted as such (rather than denying every
// request, reads included, without a count). The copies are kept per
// policy, so that their pointers are stable, as the over-limit cache needs.
func (e *Engine) envoyParams(pol *policy.Policy, p *algorithm.Params) *algorithm.Params {
	if !e.envoyCompat || p.Algorithm != sluice.FixedWindow {
		return p
	}
	c := e.compat.Load()
	if c == nil || c.pol != pol {
		// A new policy: the copies of the previous one are dropped.
		// (Checks still running on it during a reload make copies that
		// are not kept, which only costs over-limit cache hits.)
		c = &compatParams{pol: pol}
		e.compat.Store(c)
	}
	if v, ok := c.m.Load(p); ok {
		return v.(*algorithm.Params)
	}
	v, _ := c.m.LoadOrStore(p, compatOf(p))
	return v.(*algorithm.Params)
}

// compatOf returns a copy of p, a fixed window, that counts the hits it
// refuses; a deny-all p becomes a limit of 0 that does.
func compatOf(p *algorithm.Params) *algorithm.Params {
	c := *p
	c.CountRefused = true
	if c.DenyAll {
		c.DenyAll, c.Limit, c.Burst, c.ExpiryLimit = false, 0, 0, 0
	}
	return &c
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
	e := &Engine{store: observeStore(cfg.Store, cfg.Metrics), now: cfg.Now, metrics: cfg.Metrics, events: cfg.Events, envoyCompat: cfg.EnvoyCompat}
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

// Accepts reports whether the store can decide every limit of p: nil
// when it can, or when the store cannot tell (it has no
// Accepts(*algorithm.Params) error method). Call it before ApplyPolicy to
// refuse a policy the store would fail on at every check.
func (e *Engine) Accepts(p *policy.Policy) error {
	type acceptor interface {
		Accepts(*algorithm.Params) error
	}
	for _, st := range []Store{e.store, e.local} {
		a, ok := st.(acceptor)
		if !ok {
			continue
		}
		for _, l := range p.Limits() {
			for i := range l.Params {
				if err := a.Accepts(&l.Params[i]); err != nil {
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

// Ready reports whether the store decides checks: it charges one unit to
// a key of its own, under a limit no probe reaches, which expires within
// seconds. A read alone would not do: a store that answers but cannot
// write (Redis out of memory under noeviction, a read-only replica) fails
// every check that counts.
func (e *Engine) Ready(ctx context.Context) error {
	reqs := [1]store.Request{{Key: "rl:_ready", Params: &readyParams, Cost: 1}}
	var out [1]sluice.Decision
	return e.store.Check(ctx, reqs[:], out[:])
}

var readyParams = algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1 << 40, Window: time.Second})

// item is one rule (or Envoy limit) applied to one check.
type item struct {
	check  int // index of the check in its batch
	rule   *policy.Rule
	limit  *policy.Limit
	tier   string
	params *algorithm.Params
	local  *algorithm.Params
	mode   policy.FailureMode
	shadow bool
	cost   int64
	key    string
	// the outcome
	dec      sluice.Decision
	source   Source
	fallback Fallback // why the store did not decide, when it did not
	charged  int64
}

// scratch holds the per-check buffers, pooled.
type scratch struct {
	rules []*policy.Rule
	items []item
	keys  []byte
	ends  []int
	reqs  []store.Request
	out   []sluice.Decision
	src   []Source
	idx   []int
	// idemKey is the store key of the check's idempotency record, when
	// the store keeps them (IdempotentStore).
	idemKey string
	// replayed reports that the store answered from an idempotency record.
	replayed bool
}

func (e *Engine) getScratch() *scratch {
	s := e.pool.Get().(*scratch)
	s.rules, s.items, s.keys, s.ends, s.reqs, s.out, s.idx = s.rules[:0], s.items[:0], s.keys[:0], s.ends[:0], s.reqs[:0], s.out[:0], s.idx[:0]
	s.idemKey, s.replayed = "", false
	return s
}

func (e *Engine) putScratch(s *scratch) {
	if cap(s.items) > 1024 || cap(s.keys) > 1<<16 {
		return
	}
	clear(s.rules[:cap(s.rules)])
	clear(s.items[:cap(s.items)])
	clear(s.reqs[:cap(s.reqs)])
	e.pool.Put(s)
}

// validate checks the fields of c; field names are prefixed with prefix.
func validate(c *Check, prefix string) error {
	bad := func(field, reason string) error {
		return &FieldError{Field: prefix + field, Reason: reason}
	}
	if c.ClientID == "" {
		return bad("client_id", "is required")
	}
	for _, f := range [...]struct {
		name, v string
		max     int
	}{
		{"client_id", c.ClientID, MaxIdentifierLen},
		{"user", c.User, MaxIdentifierLen},
		{"ip", c.IP, MaxIdentifierLen},
		{"api_key", c.APIKey, MaxIdentifierLen},
		{"resource", c.Resource, MaxResourceLen},
		{"method", c.Method, MaxIdentifierLen},
		{"operation", c.Operation, MaxIdentifierLen},
		{"idempotency_key", c.IdempotencyKey, MaxIdentifierLen},
	} {
		if len(f.v) > f.max {
			return bad(f.name, "longer than "+strconv.Itoa(f.max)+" bytes")
		}
		if !utf8.ValidString(f.v) {
			return bad(f.name, "is not valid UTF-8")
		}
	}
	if c.Cost < 0 {
		return bad("cost", "must not be negative")
	}
	if c.Cost > MaxCost {
		return bad("cost", "must be at most "+strconv.Itoa(MaxCost))
	}
	if c.Priority > PriorityLow {
		return bad("priority", "unknown priority")
	}
	return nil
}

func request(c *Check) policy.Request {
	return policy.Request{ClientID: c.ClientID, User: c.User, IP: c.IP, APIKey: c.APIKey,
		Resource: c.Resource, Method: c.Method, Operation: strings.ToLower(c.Operation)}
}

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
func (e *Engine) Check(ctx context.Context, c *Check) (Result, error) {
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
	if err := validate(c, ""); err != nil {
		return Result{}, err
	}
	return e.check(ctx, e.policy.Load(), c)
}

func (e *Engine) clock(c *Check) time.Time {
	if !c.Now.IsZero() {
		return c.Now
	}
	return e.now()
}

// listed decides a check from the allow and deny lists; ok is false when
// neither applies.
func listed(p *policy.Policy, q *policy.Request) (r Result, ok bool) {
	if p.Denied(q) {
		rr := RuleResult{Rule: "deny_list", Source: SourceDenyList}
		return Result{Allowed: false, Deciding: rr, Rules: []RuleResult{rr}, Source: SourceDenyList}, true
	}
	if p.Allowed(q) {
		rr := RuleResult{Rule: "allow_list", Allowed: true, Source: SourceAllowList}
		return Result{Allowed: true, Deciding: rr, Source: SourceAllowList}, true
	}
	return Result{}, false
}

func (e *Engine) check(ctx context.Context, p *policy.Policy, c *Check) (Result, error) {
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
		if _, ok := e.store.(IdempotentStore); !ok {
			return e.idem.do(ctx, e.clock(c), newIdemKey(c.ClientID, c.IdempotencyKey, h), func() (Result, error) {
				return e.decideItems(ctx, s, c), nil
			})
		}
		var hex [16]byte
		for i := range hex {
			hex[i] = "0123456789abcdef"[h>>(60-4*i)&15]
		}
		s.idemKey = "rl:idem:{" + escape(c.ClientID) + "}:" + escape(c.IdempotencyKey) + ":" + string(hex[:])
	}
	return e.decideItems(ctx, s, c), nil
}

// decideItems decides the planned items of the check c and assembles its
// result.
func (e *Engine) decideItems(ctx context.Context, s *scratch, c *Check) Result {
	allowed := e.run(ctx, s, c.Now, true)
	res := assemble(s.items, allowed)
	if s.replayed {
		res.Source = SourceIdempotent
	}
	return res
}

// counters returns a hash of the keys that items count on and of which of
// them are shadow rules: checks with the same hash count on the same
// state, alike. Keys hold no byte below 0x20 (they are escaped), so the
// separators keep apart keys that concatenate alike.
func counters(items []item) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037) // FNV-1a
	for i := range items {
		it := &items[i]
		for j := 0; j < len(it.key); j++ {
			h = (h ^ uint64(it.key[j])) * prime
		}
		sep := uint64(0)
		if it.shadow {
			sep = 1
		}
		h = (h ^ sep) * prime
	}
	return h
}

// escape writes ':', '{', '}' and '%' of s as %XX, as store keys do.
func escape(s string) string {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ':', '{', '}', '%':
			var b []byte
			for j := 0; j < len(s); j++ {
				switch c := s[j]; c {
				case ':', '{', '}', '%':
					b = append(b, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
				default:
					b = append(b, c)
				}
			}
			return string(b)
		}
	}
	return s
}

// plan appends to s.items the rules of p that apply to c, with their keys
// written into s.keys (see finishKeys).
func (e *Engine) plan(s *scratch, p *policy.Policy, c *Check, q *policy.Request, check int, prefix string) error {
	s.rules = p.Match(q, s.rules[:0])
	if len(s.rules) == 0 {
		return nil
	}
	tier, asg := p.Lookup(q, e.clock(c))
	for _, r := range s.rules {
		l := r.LimitFor(tier, asg)
		if l == nil {
			continue
		}
		keys, ok := r.AppendKey(s.keys, l, q)
		if !ok {
			s.keys = keys[:len(s.keys)]
			continue
		}
		s.keys = keys
		cost, ok := r.Cost(q.Operation, c.Cost)
		if !ok || cost > sluice.MaxLimit {
			return &FieldError{Field: prefix + "cost", Reason: "too large after the cost multiplier of rule " + r.ID}
		}
		it := item{check: check, rule: r, limit: l, mode: r.FailureMode, shadow: r.Shadow, cost: cost}
		it.params = &l.Params[c.Priority]
		if r.FailureMode == policy.FailLocal {
			it.local = &l.Local[c.Priority]
		}
		if l != r.Base {
			it.tier = tier
		}
		s.items = append(s.items, it)
		s.ends = append(s.ends, len(s.keys))
	}
	return nil
}

// finishKeys turns the key bytes into strings with one allocation.
func (e *Engine) finishKeys(s *scratch) {
	all := string(s.keys)
	start := 0
	for i := range s.items {
		s.items[i].key = all[start:s.ends[i]]
		start = s.ends[i]
	}
}

// run decides the items of s: the enforcing ones in one CheckAll, then the
// shadow ones on their own. It reports whether every enforcing item
// allowed. now is passed to the store (zero: the store's clock).
func (e *Engine) run(ctx context.Context, s *scratch, now time.Time, atomicAll bool) bool {
	s.idx = s.idx[:0]
	s.reqs = s.reqs[:0]
	for i := range s.items {
		it := &s.items[i]
		if !it.shadow {
			s.idx = append(s.idx, i)
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: it.cost, Now: now})
		}
	}
	allowed := true
	if len(s.reqs) == 0 && s.idemKey != "" && e.claimShadow(ctx, s, now) {
		// A repeat charges nothing, shadow rules included.
		s.replayed = true
		e.runShadow(ctx, s, now, false)
		return true
	}
	if len(s.reqs) > 0 {
		s.out = grow(s.out, len(s.reqs))
		var err error
		replayed := false
		s.src = growSource(s.src, len(s.reqs))
		if is, ok := e.store.(IdempotentStore); ok && s.idemKey != "" {
			replayed, err = is.CheckAllOnce(ctx, s.idemKey, e.ttl, s.reqs, s.out)
			for j := range s.src {
				s.src[j] = SourceStore
			}
		} else {
			err = e.storeCheck(ctx, atomicAll, s.reqs, s.out, s.src)
		}
		if err == nil && replayed {
			s.replayed = true
			for j, i := range s.idx {
				it := &s.items[i]
				it.dec, it.source = s.out[j], SourceIdempotent
				if !it.dec.Allowed {
					allowed = false
				}
			}
			if !allowed {
				for _, i := range s.idx {
					if it := &s.items[i]; !blocking(it.dec) {
						it.dec.Allowed, it.dec.Reason = true, sluice.ReasonAllowed
					}
				}
			}
			// A repeat charges nothing, shadow rules included.
			e.runShadow(ctx, s, now, false)
			return allowed
		}
		if err != nil {
			allowed = e.fallback(ctx, s, now, FallbackOf(err))
		} else {
			for j, i := range s.idx {
				it := &s.items[i]
				it.dec, it.source = s.out[j], s.src[j]
				if !it.dec.Allowed {
					allowed = false
				}
			}
			if allowed {
				for _, i := range s.idx {
					s.items[i].charged = s.items[i].cost
				}
			} else if atomicAll {
				// CheckAll consumed nothing: report what each rule
				// would have decided on its own.
				for _, i := range s.idx {
					it := &s.items[i]
					if !blocking(it.dec) {
						it.dec.Allowed = true
						it.dec.Reason = sluice.ReasonAllowed
					}
				}
			} else {
				for _, i := range s.idx {
					if s.items[i].dec.Allowed {
						s.items[i].charged = s.items[i].cost
					}
				}
			}
		}
	}
	e.runShadow(ctx, s, now, allowed)
	return allowed
}

// claimShadow claims the idempotency key of a check with no enforcing
// item in a store that keeps the records, by recording a read of its
// shadow items, and reports whether the key was already claimed: the check
// is then a repeat and charges nothing. It reports false when the store
// does not keep the records or cannot answer (the check is decided anew).
func (e *Engine) claimShadow(ctx context.Context, s *scratch, now time.Time) bool {
	is, ok := e.store.(IdempotentStore)
	if !ok {
		return false
	}
	for i := range s.items {
		if it := &s.items[i]; it.shadow {
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Now: now})
		}
	}
	if len(s.reqs) == 0 {
		return false
	}
	s.out = grow(s.out, len(s.reqs))
	replayed, err := is.CheckAllOnce(ctx, s.idemKey, e.ttl, s.reqs, s.out)
	s.reqs = s.reqs[:0]
	return err == nil && replayed
}

// runShadow decides the shadow items: charged when allowed, read otherwise.
func (e *Engine) runShadow(ctx context.Context, s *scratch, now time.Time, allowed bool) {
	s.idx = s.idx[:0]
	s.reqs = s.reqs[:0]
	for i := range s.items {
		it := &s.items[i]
		if it.shadow {
			cost := it.cost
			if !allowed {
				cost = 0
			}
			s.idx = append(s.idx, i)
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: cost, Now: now})
		}
	}
	if len(s.reqs) == 0 {
		return
	}
	s.out = grow(s.out, len(s.reqs))
	s.src = growSource(s.src, len(s.reqs))
	if err := e.storeCheck(ctx, false, s.reqs, s.out, s.src); err != nil {
		// A shadow rule never denies: it reports that it could not tell.
		why := FallbackOf(err)
		for _, i := range s.idx {
			it := &s.items[i]
			it.dec = sluice.Decision{Allowed: true, Limit: it.params.Limit, Remaining: it.params.Limit}
			it.source, it.fallback = SourceFailOpen, why
		}
		return
	}
	for j, i := range s.idx {
		it := &s.items[i]
		it.dec, it.source = s.out[j], s.src[j]
		if it.dec.Allowed {
			it.charged = s.reqs[j].Cost
		}
	}
}

// blocking reports whether d is a denial of its own, rather than a
// request CheckAll refused because another request of the batch was
// denied (reported as limited with no retry-after).
func blocking(d sluice.Decision) bool {
	return !d.Allowed && (d.Reason != sluice.ReasonLimited || d.RetryAfter > 0)
}

func grow(out []sluice.Decision, n int) []sluice.Decision {
	if cap(out) < n {
		return make([]sluice.Decision, n)
	}
	return out[:n]
}

func growSource(src []Source, n int) []Source {
	if cap(src) < n {
		return make([]Source, n)
	}
	return src[:n]
}

// storeCheck is the one place the engine calls the store to decide: all
// selects CheckAll (one unit) over Check (each on its own). It writes to
// src what decided each request (see SourcedStore; SourceStore for a
// plain store). Resilience (per-call deadline, circuit breaker,
// over-limit cache, hot keys) lives in a store decorator, internal/guard;
// an error means the store did not decide and the failure modes apply.
func (e *Engine) storeCheck(ctx context.Context, all bool, reqs []store.Request, out []sluice.Decision, src []Source) error {
	// One request decides alike either way, and Check has the stores'
	// single-check path (on Redis a script a third of the cost).
	all = all && len(reqs) > 1
	if ss, ok := e.store.(SourcedStore); ok {
		return ss.CheckSourced(ctx, all, reqs, out, src)
	}
	for i := range src {
		src[i] = SourceStore
	}
	if all {
		return e.store.CheckAll(ctx, reqs, out)
	}
	return e.store.Check(ctx, reqs, out)
}

// fallback decides the enforcing items of s after the store failed (for
// the reason why), by each rule's failure mode: any fail_closed rule
// denies the check as unavailable (and nothing is consumed locally);
// otherwise the local rules are decided together on the in-process
// limiter with their share of the limit, and the fail_open rules allow.
// A local rule without a share (a limit that denies everything) fails
// closed, and so do the local rules when the in-process limiter fails:
// only a rule written fail_open admits without a bound.
func (e *Engine) fallback(ctx context.Context, s *scratch, now time.Time, why Fallback) bool {
	closed := false
	for _, i := range s.idx {
		it := &s.items[i]
		it.fallback = why
		if it.mode == policy.FailLocal && (it.local == nil || it.local.Algorithm == 0) {
			it.mode = policy.FailClosed
		}
		if it.mode == policy.FailClosed {
			closed = true
		}
	}
	if !closed {
		var reqs []store.Request
		var idx []int
		for _, i := range s.idx {
			it := &s.items[i]
			if it.mode == policy.FailLocal {
				reqs = append(reqs, store.Request{Key: it.key, Params: it.local, Cost: it.cost, Now: now})
				idx = append(idx, i)
			} else {
				it.dec = sluice.Decision{Allowed: true, Limit: it.params.Limit, Remaining: it.params.Limit}
				it.source = SourceFailOpen
			}
		}
		if len(reqs) == 0 {
			return true
		}
		out := make([]sluice.Decision, len(reqs))
		if err := e.local.CheckAll(ctx, reqs, out); err == nil {
			return e.localDecided(s, idx, out)
		}
		for _, i := range idx {
			s.items[i].mode = policy.FailClosed
		}
	}
	for _, i := range s.idx {
		it := &s.items[i]
		it.dec = sluice.Decision{Limit: it.params.Limit}
		if it.mode == policy.FailClosed {
			it.source = SourceFailClosed
		} else {
			it.dec.Allowed = true
			it.source = failSource(it.mode)
		}
	}
	return false
}

// localDecided takes the decisions out of the in-process limiter for the
// items idx of s, and reports whether they all allowed.
func (e *Engine) localDecided(s *scratch, idx []int, out []sluice.Decision) bool {
	allowed := true
	for j := range out {
		if !out[j].Allowed {
			allowed = false
		}
	}
	for j, i := range idx {
		it := &s.items[i]
		it.dec, it.source = out[j], SourceLocal
		if allowed {
			it.charged = it.cost
		} else if !blocking(it.dec) {
			it.dec.Allowed, it.dec.Reason = true, sluice.ReasonAllowed
		}
	}
	return allowed
}

func failSource(m policy.FailureMode) Source {
	switch m {
	case policy.FailClosed:
		return SourceFailClosed
	case policy.FailLocal:
		return SourceLocal
	}
	return SourceFailOpen
}

// assemble builds the Result of a check from its items; allowed is the
// verdict of its enforcing rules.
func assemble(items []item, allowed bool) Result {
	res := Result{Allowed: allowed, Rules: make([]RuleResult, len(items))}
	deciding := -1
	var maxRetry time.Duration
	never := false // a denying rule can never admit the check
	for i := range items {
		it := &items[i]
		rr := RuleResult{Rule: it.rule.ID, Tier: it.tier, Allowed: it.dec.Allowed, Shadow: it.shadow,
			Limit: it.dec.Limit, Remaining: it.dec.Remaining, ResetAfter: it.dec.ResetAfter,
			RetryAfter: it.dec.RetryAfter, Cost: it.charged, Source: it.source, Fallback: it.fallback}
		if rr.Limit == 0 && !it.params.DenyAll {
			rr.Limit = it.params.Limit
		}
		res.Rules[i] = rr
		if it.shadow {
			if !it.dec.Allowed {
				res.ShadowDenied = true
			}
			continue
		}
		if it.source == SourceFailClosed {
			res.Unavailable = true
			res.Fallback = it.fallback
		}
		if allowed {
			if deciding < 0 || rr.Remaining < res.Rules[deciding].Remaining {
				deciding = i
			}
		} else if !rr.Allowed {
			// The first rule that can never admit the check decides
			// it, else the first denying rule.
			n := it.dec.Reason == sluice.ReasonCostExceedsCapacity || it.dec.Reason == sluice.ReasonDenyAll
			if deciding < 0 || n && !never {
				deciding = i
			}
			never = never || n
			maxRetry = max(maxRetry, rr.RetryAfter)
		}
	}
	if deciding < 0 {
		// No enforcing rule denied (a check refused with its batch), or
		// only shadow rules apply: the most constrained enforcing rule,
		// or without one the most constrained shadow rule. A shadow rule
		// never decides a denial.
		for i := range res.Rules {
			r, d := &res.Rules[i], &res.Rules[max(deciding, 0)]
			if deciding < 0 || d.Shadow && !r.Shadow || d.Shadow == r.Shadow && r.Remaining < d.Remaining {
				deciding = i
			}
		}
	}
	res.Deciding = res.Rules[deciding]
	if !allowed {
		// A retry can succeed once every denying rule admits it: never,
		// when one of them cannot.
		res.Deciding.RetryAfter = maxRetry
		if never {
			res.Deciding.RetryAfter = 0
		}
	}
	res.Source = res.Deciding.Source
	if res.Unavailable {
		res.Source = SourceFailClosed
	} else {
		res.Fallback = res.Deciding.Fallback
	}
	return res
}

// BatchCheck decides several checks in mode. In AllOrNothing mode the
// enforcing rules of every check go to the store in one CheckAll: every
// check is allowed, or none is and nothing is consumed; a deny-listed
// check denies the batch. Idempotency keys apply in BestEffort mode only
// (each check is then an ordinary Check). A bad check fails the whole
// batch with a *FieldError naming it, such as "checks[2].client_id".
func (e *Engine) BatchCheck(ctx context.Context, checks []Check, mode BatchMode) ([]Result, error) {
	if !e.observing() {
		return e.batch(ctx, checks, mode)
	}
	start := time.Now()
	out, err := e.batch(ctx, checks, mode)
	e.observeBatch(ctx, start, checks, out, err)
	return out, err
}

// batch is BatchCheck, unobserved.
func (e *Engine) batch(ctx context.Context, checks []Check, mode BatchMode) ([]Result, error) {
	if len(checks) == 0 {
		return nil, &FieldError{Field: "checks", Reason: "must not be empty"}
	}
	if len(checks) > MaxBatch {
		return nil, &FieldError{Field: "checks", Reason: "more than " + strconv.Itoa(MaxBatch) + " checks"}
	}
	for i := range checks {
		if err := validate(&checks[i], "checks["+strconv.Itoa(i)+"]."); err != nil {
			return nil, err
		}
	}
	switch mode {
	case BestEffort:
		out := make([]Result, len(checks))
		for i := range checks {
			r, err := e.decide(ctx, &checks[i])
			if err != nil {
				var fe *FieldError
				if errors.As(err, &fe) {
					fe.Field = "checks[" + strconv.Itoa(i) + "]." + fe.Field
				}
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	case AllOrNothing:
		return e.batchAll(ctx, checks)
	}
	return nil, &FieldError{Field: "mode", Reason: "unknown batch mode"}
}

func (e *Engine) batchAll(ctx context.Context, checks []Check) ([]Result, error) {
	p := e.policy.Load()
	out := make([]Result, len(checks))
	decided := make([]bool, len(checks))
	denied := false
	s := e.getScratch()
	defer e.putScratch(s)
	var now time.Time
	for i := range checks {
		c := &checks[i]
		if now.IsZero() {
			now = c.Now
		}
		q := request(c)
		if r, ok := listed(p, &q); ok {
			out[i], decided[i] = r, true
			if !r.Allowed {
				denied = true
			}
			continue
		}
		if err := e.plan(s, p, c, &q, i, "checks["+strconv.Itoa(i)+"]."); err != nil {
			return nil, err
		}
	}
	if denied {
		// A deny-listed check denies the batch: nothing goes to the store.
		for i := range out {
			if !decided[i] {
				out[i] = Result{Allowed: false, Source: SourceDenyList, Deciding: RuleResult{Rule: "deny_list", Source: SourceDenyList}}
			}
			out[i].Allowed = false
		}
		return out, nil
	}
	allowed := true
	if len(s.items) > 0 {
		e.finishKeys(s)
		allowed = e.run(ctx, s, now, true)
	}
	start := 0
	for i := range checks {
		if decided[i] {
			continue
		}
		end := start
		for end < len(s.items) && s.items[end].check == i {
			end++
		}
		if end == start {
			out[i] = Result{Allowed: true, Source: SourceNoRule, Deciding: RuleResult{Allowed: true, Source: SourceNoRule}}
		} else {
			out[i] = assemble(s.items[start:end], allowed)
		}
		start = end
	}
	if !allowed {
		for i := range out {
			out[i].Allowed = false
		}
	}
	return out, nil
}

// Status returns, for every rule that applies to c, its limit and remaining
// quota, consuming nothing (c.Cost is ignored).
func (e *Engine) Status(ctx context.Context, c *Check) ([]RuleResult, error) {
	if err := validate(c, ""); err != nil {
		return nil, err
	}
	p := e.policy.Load()
	q := request(c)
	if r, ok := listed(p, &q); ok {
		return r.Rules, nil
	}
	s := e.getScratch()
	defer e.putScratch(s)
	peek := *c
	peek.Cost = 0
	if err := e.plan(s, p, &peek, &q, 0, ""); err != nil {
		return nil, err
	}
	if len(s.items) == 0 {
		return nil, nil
	}
	e.finishKeys(s)
	s.reqs = s.reqs[:0]
	for i := range s.items {
		it := &s.items[i]
		s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: 0, Now: c.Now})
	}
	s.out = grow(s.out, len(s.reqs))
	if err := e.storeCheck(ctx, false, s.reqs, s.out, nil); err != nil {
		return nil, err
	}
	out := make([]RuleResult, len(s.items))
	for i := range s.items {
		it := &s.items[i]
		d := s.out[i]
		out[i] = RuleResult{Rule: it.rule.ID, Tier: it.tier, Allowed: d.Allowed, Shadow: it.shadow,
			Limit: d.Limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter, Source: SourceStore}
	}
	return out, nil
}

// Reset forgets the state of every rule that applies to c, under every
// limit the rule may apply to c (its own, each tier's, c's overrides).
func (e *Engine) Reset(ctx context.Context, c *Check) error {
	if err := validate(c, ""); err != nil {
		return err
	}
	p := e.policy.Load()
	q := request(c)
	_, asg := p.Lookup(&q, e.clock(c))
	rules := p.Match(&q, nil)
	var keys []string
	seen := map[string]bool{}
	for _, r := range rules {
		limits := r.Limits()
		if asg != nil {
			if l, ok := asg.Limits[r.ID]; ok {
				limits = append(limits, l)
			}
		}
		for _, l := range limits {
			k, ok := r.AppendKey(nil, l, &q)
			if ok && !seen[string(k)] {
				seen[string(k)] = true
				keys = append(keys, string(k))
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if err := e.store.Reset(ctx, keys...); err != nil {
		return err
	}
	return e.local.Reset(ctx, keys...)
}

// Descriptor is one Envoy rate-limit descriptor: an ordered list of
// key/value entries, with an optional per-descriptor hits addend.
type Descriptor struct {
	Entries []DescriptorEntry
	// HitsAddend is what the descriptor is charged, in place of the
	// request's addend, when HitsSet is true; 0 then decides it without
	// consuming anything. It is ignored when HitsSet is false.
	HitsAddend uint64
	// HitsSet reports that the descriptor carries its own HitsAddend.
	HitsSet bool
	// Limit, when set, is the limit the descriptor asks for in place of
	// the configured one (Envoy's limit override).
	Limit LimitOverride
}

// LimitOverride is an Envoy descriptor's limit override: RequestsPerUnit
// per Unit, counted on fixed windows. The zero value is no override.
type LimitOverride struct {
	// RequestsPerUnit is the limit, 1 to math.MaxUint32.
	RequestsPerUnit int64
	// Unit is the window, such as a minute, or 30 seconds for a unit of a
	// second with a multiplier of 30; at most sluice.MaxWindow.
	Unit time.Duration
}

// DescriptorEntry is one key/value pair of a Descriptor.
type DescriptorEntry = policy.DescriptorEntry

// DescriptorStatus is the answer for one descriptor, as Envoy expects it.
type DescriptorStatus struct {
	OverLimit bool
	// HasLimit is false when no rule matched the descriptor (Envoy's OK
	// with no current_limit), and for unlimited descriptors.
	HasLimit bool
	// Limit is requests per Unit (Envoy's current_limit).
	Limit int64
	Unit  time.Duration
	// Remaining is Envoy's limit_remaining; math.MaxUint32 for an
	// unlimited descriptor.
	Remaining          int64
	DurationUntilReset time.Duration
	// Rule is the configuration entry's full key, such as
	// "messaging.message_type_marketing.to_number"; "" when none matched.
	Rule string
	// Shadow reports a shadow_mode limit: it never reports over limit.
	Shadow bool
}

// ShouldRateLimit decides Envoy descriptors for domain, each charged
// hitsAddend (0 means 1) unless the descriptor sets its own (HitsSet),
// which may be 0: the descriptor is then decided without being charged.
// overLimit is true when any descriptor is over its limit.
//
// The descriptors are matched as envoyproxy/ratelimit does (see
// policy.Policy.EnvoyLimit), a descriptor's limit override replaces what
// it matched in a domain of the policy (see policy.Policy.EnvoyOverride),
// `replaces` drops the limits it names, and the
// limits that remain are decided like the rules of one check: the
// non-shadow ones in one CheckAll (a request over one limit consumes none
// of the others), then the shadow ones. Store failures fail open.
//
// With Config.EnvoyCompat, as envoyproxy/ratelimit: the non-shadow limits
// are decided each on its own (a request over one limit is counted on the
// others), fixed windows count the hits they refuse (so that a window
// stays over its limit until it ends, check-only descriptors included), a
// requests_per_unit of 0 is such a window (it admits check-only
// descriptors until a hit is counted), and a descriptor with no entries
// is not limited instead of refused.
func (e *Engine) ShouldRateLimit(ctx context.Context, domain string, descs []Descriptor, hitsAddend uint64) (statuses []DescriptorStatus, overLimit bool, err error) {
	if e.metrics != nil {
		defer e.observeEnvoy(time.Now(), &overLimit, &err)
	}
	if domain == "" {
		return nil, false, &FieldError{Field: "domain", Reason: "is required"}
	}
	if len(descs) == 0 {
		return nil, false, &FieldError{Field: "descriptors", Reason: "must not be empty"}
	}
	if len(descs) > MaxBatch {
		return nil, false, &FieldError{Field: "descriptors", Reason: "more than " + strconv.Itoa(MaxBatch) + " descriptors"}
	}
	if hitsAddend > MaxCost {
		return nil, false, &FieldError{Field: "hits_addend", Reason: "must be at most " + strconv.Itoa(MaxCost)}
	}
	for i, d := range descs {
		if d.HitsAddend > MaxCost {
			return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].hits_addend", Reason: "must be at most " + strconv.Itoa(MaxCost)}
		}
		if len(d.Entries) == 0 && !e.envoyCompat {
			return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries", Reason: "must not be empty"}
		}
		if o := d.Limit; o != (LimitOverride{}) {
			if o.RequestsPerUnit < 1 || o.RequestsPerUnit > math.MaxUint32 {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.requests_per_unit", Reason: "must be between 1 and " + strconv.Itoa(math.MaxUint32)}
			}
			if o.Unit <= 0 || o.Unit > sluice.MaxWindow {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.unit", Reason: "must be a window longer than 0 and at most " + sluice.MaxWindow.String()}
			}
		}
		for j, en := range d.Entries {
			if en.Key == "" {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries[" + strconv.Itoa(j) + "].key", Reason: "is required"}
			}
			if len(en.Key) > MaxEntryLen || len(en.Value) > MaxEntryLen {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries[" + strconv.Itoa(j) + "]", Reason: "longer than " + strconv.Itoa(MaxEntryLen) + " bytes"}
			}
		}
	}
	p := e.policy.Load()
	var lbuf [4]*policy.EnvoyLimit // the common case, without an allocation
	limits := lbuf[:0]
	var replaced map[string]bool
	for i := range descs {
		if o := descs[i].Limit; o.Unit != 0 {
			l, err := p.EnvoyOverride(domain, o.RequestsPerUnit, o.Unit)
			if err != nil {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit", Reason: err.Error()}
			}
			limits = append(limits, l)
		} else if len(descs[i].Entries) == 0 {
			limits = append(limits, nil) // (EnvoyCompat) not limited
		} else {
			limits = append(limits, p.EnvoyLimit(domain, descs[i].Entries))
		}
		if l := limits[i]; l != nil && len(l.Replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, n := range l.Replaces {
				replaced[n] = true
			}
		}
	}
	statuses = make([]DescriptorStatus, len(descs))
	type ref struct{ desc, item int }
	var rbuf [4]ref
	refs := rbuf[:0]
	s := e.getScratch()
	defer e.putScratch(s)
	for i, l := range limits {
		if l == nil || (l.Name != "" && replaced[l.Name]) {
			continue
		}
		if l.Unlimited {
			statuses[i] = DescriptorStatus{Remaining: math.MaxUint32, Rule: l.FullKey}
			continue
		}
		hits := max(hitsAddend, 1)
		if descs[i].HitsSet {
			hits = descs[i].HitsAddend
		}
		s.keys = l.AppendKey(s.keys[:0], descs[i].Entries)
		it := item{params: e.envoyParams(p, &l.Limit.Params[PriorityNormal]), mode: l.FailureMode,
			shadow: l.Shadow, cost: int64(hits), key: string(s.keys), limit: l.Limit}
		if it.mode == policy.FailLocal {
			it.local = &l.Limit.Local[PriorityNormal]
		}
		s.items = append(s.items, it)
		refs = append(refs, ref{i, len(s.items) - 1})
	}
	if len(s.items) == 0 {
		return statuses, false, nil
	}
	// With EnvoyCompat each descriptor is decided on its own, so that a
	// request over one limit counts on the others too.
	e.run(ctx, s, time.Time{}, !e.envoyCompat)
	for _, r := range refs {
		it := &s.items[r.item]
		l := limits[r.desc]
		over := blocking(it.dec) && it.source != SourceFailOpen
		st := DescriptorStatus{HasLimit: true, Limit: l.RequestsPerUnit, Unit: l.Unit,
			Remaining: it.dec.Remaining, DurationUntilReset: it.dec.ResetAfter, Rule: l.FullKey, Shadow: l.Shadow}
		if over && !l.Shadow {
			st.OverLimit = true
			overLimit = true
		}
		if st.DurationUntilReset == 0 {
			st.DurationUntilReset = untilWindowEnd(e.now(), l.Unit)
		}
		e.observeDescriptor(ctx, domain, it, &st)
		statuses[r.desc] = st
	}
	return statuses, overLimit, nil
}

// untilWindowEnd returns the time from now to the end of the current
// window of length unit, aligned on the Unix epoch.
func untilWindowEnd(now time.Time, unit time.Duration) time.Duration {
	if unit <= 0 {
		return 0
	}
	us := now.UnixMicro()
	w := unit.Microseconds()
	return time.Duration(w-us%w) * time.Microsecond
}
