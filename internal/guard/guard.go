// Package guard wraps a store (Redis, Redis Cluster) so that checks keep
// being answered, fast, whatever the store does. It is a store decorator:
// a store.Store around a store.Store, which the engine calls where it would
// call the store.
//
// It adds four things, each optional:
//
//   - A deadline on every store call (Config.Deadline, 5 s by default),
//     and stall detection: a call gives up sooner when the store has
//     answered no call at all for the stall timeout (Config.StallTimeout,
//     learned from the store's latency). A caller's shorter deadline
//     wins. Past either the call returns an error wrapping
//     sluice.ErrStoreUnavailable (and ErrStalled or ErrDeadline), and the
//     engine applies each rule's failure mode (local, fail_closed,
//     fail_open). A slow store that keeps answering is waited for; one
//     that answers nothing is given up on quickly. The call runs
//     on a goroutine of its own, so its caller stops waiting at the
//     deadline even when the store does not (a Redis client blocked while
//     it reconnects through a slow network, for instance); at most
//     Config.MaxInFlight such calls run at once, and beyond that calls
//     fail at once. A call given up on after it was sent wraps
//     ErrMaybeCounted: the store may count it, and the service's engine
//     does not admit its check locally too.
//   - A circuit breaker (sony/gobreaker) in front of the store: above an
//     error rate over a rolling window, with a minimum number of calls, it
//     opens, and every call fails at once without touching the network
//     until, after a timeout, a few probe calls go through (half-open);
//     enough consecutive successes close it again.
//   - An over-limit cache: a key the store denied with a known retry-after
//     is denied in process until then for requests of at least the denied
//     cost, with no store call. It only ever denies what the store would
//     deny (see OverLimitConfig).
//   - A hot-key tier: a heavy-hitters sketch finds the keys checked above
//     a rate; their checks are admitted in process from a lease of units
//     consumed in the store in one call, refreshed in batches every sync
//     interval (see HotKeyConfig for the bound on overshoot).
//
// What each piece buys, on one local Redis, 64 callers of single checks
// (BenchmarkLayers; docs/PERFORMANCE.md has the figures):
//
//   - deadline: waits bounded whatever the store does; its goroutine costs
//     about a fifth of the checks/s of calls made one at a time, and is
//     one per gathered call once checks are gathered.
//   - breaker: no network call while the store is down; it costs nothing
//     measurable.
//   - gathering (Config.Gatherers): one script call for many checks, which
//     the Redis client's pipelining does not do: 2.5x to 4.5x the checks/s,
//     a third to a half of the CPU per check, client and Redis.
//   - over-limit cache: about 40% of checks answered in process when the
//     busiest keys are over their limit, 0.6x the script calls; nothing
//     otherwise.
//   - hot-key tier: as much for hot keys under their limit; nothing for a
//     GCRA limit far above its traffic, whose leases expire as soon as
//     their units refill.
//
// Requests with an explicit Now (replay, tests) and requests of cost 0
// (reads) bypass the over-limit cache and the hot-key tier: they always
// reach the store, through the deadline and the breaker. So do batches
// with an idempotency record (store.Batch.Once), when the wrapped store
// keeps them (store.Info.SharedRecords).
//
// A Guard is safe for concurrent use. It owns one background goroutine
// when the hot-key tier is on, which Close stops; one goroutine per store
// call in flight (for gathered checks, per gathering call), which ends
// when the store returns; and, while gathered checks wait, a sweeper that
// ends their wait at their deadline. It never closes the store it wraps.
package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// ErrBreakerOpen is wrapped (with sluice.ErrStoreUnavailable) by the error
// of a call refused because the circuit breaker is open, or half-open with
// its probes already in flight.
var ErrBreakerOpen error = &fallbackError{"sluice: circuit breaker open", store.FallbackBreakerOpen}

// Store is what the guard wraps, and what it is: the one interface of
// package store.
type Store = store.Store

// Defaults of Config.
const (
	DefaultDeadline = 5 * time.Second
)

// Config holds the guard's knobs. The zero value is usable: a 5 s
// deadline, a learned stall timeout, the breaker with its defaults, the
// over-limit cache on, the hot-key tier off.
type Config struct {
	// Deadline bounds every store call, a store that answers slowly
	// included; zero means DefaultDeadline. A caller's context with an
	// earlier deadline wins.
	Deadline time.Duration
	// StallTimeout ends sooner the wait of a call when the store has
	// answered no call at all (a decision or an error reply) for that
	// long, counted from the later of the call's start and the store's
	// latest answer, less the time the process itself could not run (a
	// heartbeat that beats late): a paused or cut-off store, not a busy
	// one, nor a starved process. Zero
	// learns it: 4 times the slowest answer of the last 10 to 20 seconds,
	// at least DefaultStallFloor; negative turns stall detection off. It
	// has no effect at or above Deadline.
	StallTimeout time.Duration
	// Breaker configures the circuit breaker.
	Breaker BreakerConfig
	// OverLimit configures the over-limit cache.
	OverLimit OverLimitConfig
	// HotKeys configures the hot-key tier.
	HotKeys HotKeyConfig
	// Now is the clock; nil means time.Now. The breaker's own timing
	// always uses the wall clock.
	Now func() time.Time
	// MaxInFlight bounds the store calls in flight, those whose callers
	// gave up at the deadline included; beyond it calls fail at once
	// (ErrTooManyInFlight). Zero means DefaultMaxInFlight.
	MaxInFlight int
	// Gatherers is the number of store calls of gathered checks in flight
	// at once. Checks (batches that are not All) that arrive while that
	// many calls are with the store wait, and the next call takes them all
	// (up to MaxGathered requests): under load, one call decides many
	// checks, and a Redis store decides them in one script call per node.
	// A store that reports the parts of a call as they end
	// (store.Info.Parts: the Redis store, on a cluster one part per
	// master) has each check answered with its part; a call still
	// waiting for a part once some of its checks are answered (a master
	// that does not answer) no longer counts, nor does a call past its
	// deadline whose checks were all answered (a store that returns late,
	// as a Redis client reconnecting does): their checks count against
	// MaxInFlight until the store returns. Zero means DefaultGatherers; a
	// negative number gives every check a call of its own.
	Gatherers int
	// GatherFill is how many checks must be queued for a gathered call to
	// start while another is in flight; fewer wait for the call in flight
	// and go together in the next. Redis pays for every read of a
	// connection, so one full call costs it less than two half-empty ones;
	// a rate that one call per round trip cannot carry still gets up to
	// Gatherers calls at once. Zero means DefaultGatherFill; 1 starts a
	// call for any queued check while fewer than Gatherers are in flight.
	GatherFill int
	// GatherWait is how long a check that arrives while a gathered call
	// is in flight may wait, from its arrival, for others to go in the
	// next call; the wait ends sooner once GatherFill checks are queued.
	// A check that finds the store idle has a call at once. Zero sends a
	// call as soon as a gathering slot is free. Redis pays for every read
	// of a connection, so a server that sends few checks a call (a
	// moderate rate per instance) costs Redis several times more per
	// check than one that sends dozens: a wait of a few hundred
	// microseconds cuts that cost, at up to as much latency on the checks
	// that wait. At most MaxGatherWait and half the deadline.
	GatherWait time.Duration
	// OnBreakerChange, when set, is called on every change of the
	// breaker's state, synchronously, while the breaker's lock is held: it
	// must return quickly and must not call the guard.
	OnBreakerChange func(from, to BreakerState)
	// Observer, when set, receives the guard's events, for metrics.
	Observer Observer
}

// Guard wraps a store with a deadline, a circuit breaker, an over-limit
// cache and a hot-key tier. Create it with New; stop it with Close.
type Guard struct {
	inner    Store
	info     store.Info // inner's
	parts    bool       // inner reports the parts of its calls (Info.Parts)
	nodes    bool       // inner has several nodes (Info.Cluster)
	deadline time.Duration
	stall    stallDetector
	now      func() time.Time
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	olc      *overLimitCache // nil when off
	hot      *hotTier        // nil when off
	onChange func(from, to BreakerState)
	obs      Observer
	pool     sync.Pool // *scratch
	jobs     sync.Pool // *job

	maxInFlight int64
	inflight    atomic.Int64 // store calls in flight, abandoned ones included
	gather      gatherer

	stats struct {
		storeCalls, storeErrors, refused atomic.Int64
		gatheredCalls, gatheredJobs      atomic.Int64
		overLimitHits, hotAdmits         atomic.Int64
		hotDenies, syncs, syncErrors     atomic.Int64
		opened, closed                   atomic.Int64
	}
	mu         sync.Mutex // guards lastOpened, lastClosed
	lastOpened time.Time
	lastClosed time.Time
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// New returns a guard around inner. Its errors name the offending field.
func New(inner Store, cfg Config) (*Guard, error) {
	if inner == nil {
		return nil, errors.New("guard: config: store is required")
	}
	if cfg.Deadline < 0 {
		return nil, fmt.Errorf("guard: config: deadline must not be negative, got %s", cfg.Deadline)
	}
	g := &Guard{inner: inner, deadline: cfg.Deadline, now: cfg.Now, onChange: cfg.OnBreakerChange, obs: cfg.Observer}
	g.info = inner.Info()
	g.parts, g.nodes = g.info.Parts, g.info.Cluster
	if g.obs == nil {
		g.obs = nopObserver{}
	}
	if g.deadline == 0 {
		g.deadline = DefaultDeadline
	}
	g.stall.fixed, g.stall.deadline = cfg.StallTimeout, g.deadline
	g.stall.beat.inflight = &g.inflight
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("guard: config: max in flight must not be negative, got %d", cfg.MaxInFlight)
	}
	g.gather.max = cfg.Gatherers
	if g.gather.max == 0 {
		g.gather.max = DefaultGatherers
	}
	if cfg.GatherFill < 0 || cfg.GatherFill > MaxGathered {
		return nil, fmt.Errorf("guard: config: gather fill must be between 0 and %d, got %d", MaxGathered, cfg.GatherFill)
	}
	g.gather.fill = cmp.Or(cfg.GatherFill, DefaultGatherFill)
	if cfg.GatherWait < 0 || cfg.GatherWait > min(MaxGatherWait, g.deadline/2) {
		return nil, fmt.Errorf("guard: config: gather wait must be between 0 and %s (and half the deadline), got %s", MaxGatherWait, cfg.GatherWait)
	}
	g.gather.wait = cfg.GatherWait
	g.gather.wake = make(chan struct{}, 1)
	g.maxInFlight = int64(cfg.MaxInFlight)
	if g.maxInFlight == 0 {
		g.maxInFlight = DefaultMaxInFlight
	}
	if g.now == nil {
		g.now = time.Now
	}
	bs, err := cfg.Breaker.settings()
	if err != nil {
		return nil, err
	}
	if bs != nil {
		bs.OnStateChange = g.stateChanged
		g.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](*bs)
	}
	if !cfg.OverLimit.Disabled {
		if g.olc, err = newOverLimitCache(cfg.OverLimit); err != nil {
			return nil, err
		}
		g.olc.obs = g.obs
	}
	if cfg.HotKeys.Enabled {
		if g.hot, err = newHotTier(cfg.HotKeys); err != nil {
			return nil, err
		}
		g.hot.obs = g.obs
		ctx, cancel := context.WithCancel(context.Background())
		g.cancel = cancel
		g.wg.Go(func() { g.syncLoop(ctx) })
	}
	g.pool.New = func() any { return new(scratch) }
	g.jobs.New = newJobValue
	return g, nil
}

// Close stops the hot-key tier's background goroutine and waits for it.
// It does not close the wrapped store. Calling it again does nothing.
func (g *Guard) Close() error {
	g.closeOnce.Do(func() {
		if g.cancel != nil {
			g.cancel()
		}
		g.wg.Wait()
	})
	return nil
}

// Unwrap returns the wrapped store.
func (g *Guard) Unwrap() Store { return g.inner }

// Info implements store.Store: that of the wrapped store, but for Parts
// (the guard answers each call whole).
func (g *Guard) Info() store.Info {
	info := g.info
	info.Parts = false
	return info
}

// Check decides each request on its own: Do with a batch that is not All.
func (g *Guard) Check(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	return g.Do(ctx, &store.Batch{Reqs: reqs, Out: out})
}

// CheckAll decides reqs as one unit: Do with an All batch.
func (g *Guard) CheckAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	return g.Do(ctx, &store.Batch{Reqs: reqs, Out: out, All: true})
}

// Reset forgets the keys in the wrapped store, in the over-limit cache and
// in the hot-key tier. A denial brought back after the reset by a check
// sent before it is not remembered. Resets made through other instances
// sharing the store do not reach this instance's cache: its entries stay
// until their retry-after passes.
func (g *Guard) Reset(ctx context.Context, keys ...string) error {
	if g.olc != nil {
		g.olc.forget(keys)
	}
	if g.hot != nil {
		g.hot.forget(keys)
	}
	j := g.newJob(opReset, nil, 0)
	j.keys = append(j.keys, keys...)
	err := g.run(ctx, j, nil)
	if g.olc != nil {
		g.olc.reset(keys)
	}
	return err
}

// scratch holds the buffers of one call that splits its requests between
// the store and the in-process answers.
type scratch struct {
	reqs []store.Request
	out  []sluice.Decision
	idx  []int
	hot  []*hotKey // per request: the hot key whose lease admitted it, or nil
	gen  []uint64  // per request admitted from a lease: the lease's gen
}

// Do implements store.Store. It decides b.Reqs as the wrapped store's Do
// does, each on its own or, when b.All is set, as one unit (when any
// request is denied, from the cache or by the store, nothing is consumed,
// leases of hot keys included), answering from the over-limit cache and
// the hot-key tier where it can, and reports in b.Sources, when it is not
// nil, what answered each request: store.SourceStore,
// store.SourceOverLimitCache or store.SourceHotKey. A batch with an
// idempotency record (b.Once) goes to the store whole, through the
// deadline and the breaker alone, when the store keeps the records; the
// guard ignores b.Part (its Info reports no parts).
func (g *Guard) Do(ctx context.Context, b *store.Batch) error {
	reqs, out, src, all := b.Reqs, b.Out, b.Sources, b.All
	if len(out) < len(reqs) {
		return fmt.Errorf("guard: %d decisions for %d requests", len(out), len(reqs))
	}
	clear(src) // store.SourceStore
	if b.Once != nil && g.info.SharedRecords {
		return g.once(ctx, b)
	}
	if (g.olc == nil || g.olc.empty()) && g.hot == nil {
		return g.direct(ctx, all, reqs, out)
	}
	now := g.now()
	s := g.pool.Get().(*scratch)
	defer g.putScratch(s)
	s.idx = s.idx[:0]
	s.hot = grow(s.hot, len(reqs))
	s.gen = grow(s.gen, len(reqs))
	denied := false
	deniedBy := store.SourceStore // what denied first in process
	local := 0
	for i := range reqs {
		r := &reqs[i]
		s.hot[i] = nil
		if r.Cost <= 0 || !r.Now.IsZero() || r.Params == nil {
			s.idx = append(s.idx, i)
			continue
		}
		if g.olc != nil {
			if d, ok := g.olc.lookup(r, now); ok {
				out[i] = d
				setSource(src, i, store.SourceOverLimitCache)
				g.stats.overLimitHits.Add(1)
				g.obs.OverLimitCacheHit()
				if !denied {
					deniedBy = store.SourceOverLimitCache
				}
				denied = true
				local++
				continue
			}
		}
		if g.hot != nil {
			if hk := g.hot.observe(r); hk != nil {
				d, gen, verdict := hk.take(r.Params, r.Cost, now)
				switch verdict {
				case leaseAdmit:
					out[i] = d
					s.hot[i], s.gen[i] = hk, gen
					setSource(src, i, store.SourceHotKey)
					local++
					continue
				case leaseDeny:
					out[i] = d
					setSource(src, i, store.SourceHotKey)
					g.stats.hotDenies.Add(1)
					if !denied {
						deniedBy = store.SourceHotKey
					}
					denied = true
					local++
					continue
				case leasePass:
					g.hot.dry()
				}
			}
		}
		s.idx = append(s.idx, i)
	}
	if local == 0 {
		return g.direct(ctx, all, reqs, out)
	}
	if all && denied {
		// One request is denied in process: CheckAll consumes nothing,
		// the others report their state as it stands (read from the
		// store, at cost 0), and what denied decided them all.
		g.refuseRest(s, reqs, out, g.readRest(ctx, s, reqs, out))
		for _, i := range s.idx {
			setSource(src, i, deniedBy)
		}
		return nil
	}
	if len(s.idx) > 0 {
		s.reqs, s.out = s.reqs[:0], grow(s.out, len(s.idx))
		for _, i := range s.idx {
			s.reqs = append(s.reqs, reqs[i])
		}
		if err := g.direct(ctx, all, s.reqs, s.out); err != nil {
			g.giveBack(s, reqs)
			return err
		}
		storeDenied := false
		for j, i := range s.idx {
			out[i] = s.out[j]
			if !out[i].Allowed {
				storeDenied = true
			}
		}
		if all && storeDenied {
			g.refuseRest(s, reqs, out, true)
			return nil
		}
	}
	for i := range reqs {
		if s.hot[i] != nil {
			g.stats.hotAdmits.Add(1)
		}
	}
	return nil
}

func setSource(src []store.Source, i int, s store.Source) {
	if src != nil {
		src[i] = s
	}
}

// readRest reads from the store, at cost 0, the requests of a CheckAll
// that were waiting for it (s.idx) when another was denied in process, so
// that they report their state as it stands rather than an unknown one:
// one store call, which consumes nothing (and, for a limit that counts
// refused requests, reports it over the limit when it is). It reports
// whether out holds their decisions: false when the store could not
// answer.
func (g *Guard) readRest(ctx context.Context, s *scratch, reqs []store.Request, out []sluice.Decision) bool {
	if len(s.idx) == 0 {
		return true
	}
	s.reqs, s.out = s.reqs[:0], grow(s.out, len(s.idx))
	for _, i := range s.idx {
		r := reqs[i]
		r.Cost = 0
		s.reqs = append(s.reqs, r)
	}
	if err := g.direct(ctx, false, s.reqs, s.out); err != nil {
		return false
	}
	for j, i := range s.idx {
		out[i] = s.out[j]
	}
	return true
}

// refuseRest turns the admitted requests of a CheckAll that something
// denied into refusals that consumed nothing, as the store contract has
// it (ReasonLimited, no retry-after), returning the leases they took.
// When the store could not be read for the requests that were waiting
// for it (decided is false), they are reported with their limit and 0
// remaining: what remains is not known.
func (g *Guard) refuseRest(s *scratch, reqs []store.Request, out []sluice.Decision, decided bool) {
	g.giveBack(s, reqs)
	if !decided {
		for _, i := range s.idx {
			out[i] = sluice.Decision{Reason: sluice.ReasonLimited}
			if p := reqs[i].Params; p != nil {
				out[i].Limit = p.Limit
			}
		}
	}
	for i := range reqs {
		if out[i].Allowed {
			out[i].Allowed = false
			out[i].Reason = sluice.ReasonLimited
			out[i].RetryAfter = 0
		}
	}
}

// giveBack returns to their leases the units taken for reqs, where the
// leases are still current.
func (g *Guard) giveBack(s *scratch, reqs []store.Request) {
	var now time.Time
	for i := range reqs {
		if hk := s.hot[i]; hk != nil {
			if now.IsZero() {
				now = g.now()
			}
			hk.giveBack(reqs[i].Cost, s.gen[i], now)
			s.hot[i] = nil
		}
	}
}

func (g *Guard) putScratch(s *scratch) {
	if cap(s.reqs) > 1024 {
		return
	}
	clear(s.reqs[:cap(s.reqs)])
	clear(s.hot[:cap(s.hot)])
	g.pool.Put(s)
}

// direct sends reqs to the store under the breaker and the deadline, and
// remembers its denials in the over-limit cache. A CheckAll decides a key
// that appears twice on the state its earlier requests leave, and then
// keeps nothing: such a denial says nothing of the key's own state, and
// is not remembered.
func (g *Guard) direct(ctx context.Context, all bool, reqs []store.Request, out []sluice.Decision) error {
	sent := g.now()
	var epoch uint64
	if g.olc != nil {
		epoch = g.olc.epoch.Load()
	}
	op := opCheck
	if all && len(reqs) > 1 { // one request decides alike either way
		op = opCheckAll
	}
	err := g.run(ctx, g.newJob(op, reqs, len(reqs)), out)
	if err != nil {
		return err
	}
	if g.olc == nil {
		return nil
	}
	for i := range reqs {
		if d := &out[i]; !d.Allowed && d.Reason == sluice.ReasonLimited && d.RetryAfter > 0 {
			if r := &reqs[i]; r.Cost > 0 && r.Now.IsZero() && (op != opCheckAll || !keyBefore(reqs, i)) {
				g.olc.remember(r, sent, epoch, d)
			}
		}
	}
	return nil
}

// keyBefore reports whether the key of reqs[i] is the key of an earlier
// request of reqs that may have changed its state: one of positive cost (a
// read, such as the engine sends before the merged checks of a key, leaves
// the state as it was).
func keyBefore(reqs []store.Request, i int) bool {
	for j := range i {
		if reqs[j].Key == reqs[i].Key && reqs[j].Cost > 0 {
			return true
		}
	}
	return false
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}
