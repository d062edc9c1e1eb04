package guard

import (
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// DefaultOverLimitMaxKeys is the bound of the over-limit cache when
// OverLimitConfig.MaxKeys is zero.
const DefaultOverLimitMaxKeys = 65536

// OverLimitConfig configures the over-limit cache.
//
// When the store denies a request of cost c on key k with a retry-after d
// (ReasonLimited), the store's contract says the same request would not be
// admitted before d has passed, whatever else arrives (other requests only
// consume more). So until sent+d, where sent is the instant the guard
// sent the request (before the store decided), every request on k with
// the same params and a cost of at least c is denied in process: decision
// source over_limit_cache, no store call, nothing consumed. Requests of a
// smaller cost still go to the store, which may admit them sooner, and so
// do requests with other params: the priorities, tiers and overrides of a
// rule count on one key with different limits, and a denial under one
// says nothing of another (the params are compared by pointer, stable for
// a compiled policy). The cache therefore never denies a
// request the store would have admitted, and never admits anything; it
// can only be stale in one way: a Reset made through another instance is
// not seen here until the entry expires. For the window algorithms and
// cost 1 the retry-after is the time to the next slot, so a cost-1 client
// retrying at retry-after is answered exactly.
type OverLimitConfig struct {
	// Disabled turns the cache off.
	Disabled bool
	// MaxKeys bounds the keys remembered; zero means
	// DefaultOverLimitMaxKeys. Each entry holds a copy of its key and
	// about 100 bytes. When full, an expired entry, or else an
	// arbitrary one, makes room (forgetting an entry only costs a store
	// call).
	MaxKeys int
}

// olcShards is the number of shards of the over-limit cache.
const olcShards = 32

type olcEntry struct {
	until   time.Time // denied until then
	resetAt time.Time // fully restored then, if nothing else arrives
	cost    int64     // denied at this cost and above
	limit   int64
	params  *algorithm.Params // denied under these params only
}

type olcShard struct {
	mu  sync.Mutex
	m   map[string]olcEntry
	max int // keys at most; the shards' bounds add up to MaxKeys
}

type overLimitCache struct {
	obs  Observer
	seed maphash.Seed
	n    atomic.Int64
	// epoch changes after every reset: a denial decided by a call sent in
	// an earlier epoch may predate the reset, and is not remembered.
	epoch  atomic.Uint64
	shards [olcShards]olcShard
}

func newOverLimitCache(c OverLimitConfig) (*overLimitCache, error) {
	if c.MaxKeys < 0 {
		return nil, fmt.Errorf("guard: config: over-limit cache max keys must not be negative, got %d", c.MaxKeys)
	}
	maxKeys := c.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultOverLimitMaxKeys
	}
	o := &overLimitCache{obs: nopObserver{}, seed: maphash.MakeSeed()}
	for i := range o.shards {
		// Below olcShards keys, some shards hold none: their keys are
		// not remembered, which only costs store calls.
		o.shards[i].m = map[string]olcEntry{}
		o.shards[i].max = maxKeys / olcShards
		if i < maxKeys%olcShards {
			o.shards[i].max++
		}
	}
	return o, nil
}

// empty reports whether the cache holds nothing, so that checks skip it.
func (o *overLimitCache) empty() bool { return o.n.Load() == 0 }

func (o *overLimitCache) shard(key string) *olcShard {
	return &o.shards[maphash.String(o.seed, key)%olcShards]
}

// lookup returns the cached denial of r at now, if any: one of a request
// with r's params and at most r's cost.
func (o *overLimitCache) lookup(r *store.Request, now time.Time) (sluice.Decision, bool) {
	if o.empty() {
		return sluice.Decision{}, false
	}
	sh := o.shard(r.Key)
	sh.mu.Lock()
	e, ok := sh.m[r.Key]
	if ok && !now.Before(e.until) {
		delete(sh.m, r.Key)
		o.obs.OverLimitEntries(int(o.n.Add(-1)))
		ok = false
	}
	sh.mu.Unlock()
	if !ok || e.params != r.Params || r.Cost < e.cost {
		return sluice.Decision{}, false
	}
	// The store's own figure: until is a quantum early (see inQuantum).
	retry := e.until.Sub(now) + time.Duration(e.params.Quantum)*time.Microsecond
	return sluice.Decision{Reason: sluice.ReasonLimited, Limit: e.limit, RetryAfter: retry, ResetAfter: max(retry, e.resetAt.Sub(now))}, true
}

// inQuantum returns d, a reset or retry-after a store decided under p,
// less one quantum of p: the store counts time in quanta and measures d
// from the start of the current one, so d may be up to a quantum long (a
// second for a limit counted in seconds). What is kept in process until
// then ends no later than the store's own state.
func inQuantum(d time.Duration, p *algorithm.Params) time.Duration {
	return d - time.Duration(p.Quantum)*time.Microsecond
}

// remember records that r, sent at sent in epoch, was denied with d,
// unless a reset has ended since. The epoch is compared under the shard's
// lock, which reset's forget takes after the epoch changes, so that a
// denial is either not remembered or forgotten by the reset.
func (o *overLimitCache) remember(r *store.Request, sent time.Time, epoch uint64, d *sluice.Decision) {
	until := sent.Add(inQuantum(d.RetryAfter, r.Params))
	sh := o.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if o.epoch.Load() != epoch {
		return
	}
	e, ok := sh.m[r.Key]
	next := olcEntry{until: until, resetAt: sent.Add(d.ResetAfter), cost: r.Cost, limit: d.Limit, params: r.Params}
	// The key is copied: r.Key may be cut from a larger string (the
	// engine writes a check's keys into one), which the entry would
	// otherwise keep alive. A map write stores the key written, so an
	// update copies it too.
	if ok {
		// Keep what the two denials together say: under the same params,
		// a smaller cost denied as long covers both; otherwise the newest
		// wins.
		if e.params == r.Params && e.cost <= r.Cost && !e.until.Before(until) {
			return
		}
		sh.m[strings.Clone(r.Key)] = next
		return
	}
	if sh.max == 0 {
		return
	}
	if len(sh.m) >= sh.max {
		o.evict(sh, sent)
	}
	sh.m[strings.Clone(r.Key)] = next
	o.obs.OverLimitEntries(int(o.n.Add(1)))
}

// evict makes room in sh: an expired entry, or else any one. Requires
// sh.mu held.
func (o *overLimitCache) evict(sh *olcShard, now time.Time) {
	scanned := 0
	var victim string
	for k, e := range sh.m {
		if e.until.Before(now) || scanned == 8 {
			victim = k
			break
		}
		if scanned == 0 {
			victim = k
		}
		scanned++
	}
	delete(sh.m, victim)
	o.obs.OverLimitEntries(int(o.n.Add(-1)))
}

// reset drops keys after the store has reset them: denials of calls sent
// before are not remembered from now on, and those remembered meanwhile
// are dropped.
func (o *overLimitCache) reset(keys []string) {
	o.epoch.Add(1)
	o.forget(keys)
}

// forget drops keys.
func (o *overLimitCache) forget(keys []string) {
	for _, k := range keys {
		sh := o.shard(k)
		sh.mu.Lock()
		if _, ok := sh.m[k]; ok {
			delete(sh.m, k)
			o.obs.OverLimitEntries(int(o.n.Add(-1)))
		}
		sh.mu.Unlock()
	}
}
