package guard

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Defaults of HotKeyConfig.
const (
	DefaultHotThreshold    = 1000.0
	DefaultHotSyncInterval = 20 * time.Millisecond
	DefaultHotWindow       = 200 * time.Millisecond
	DefaultHotMaxKeys      = 64
	DefaultHotSketchWidth  = 4096
)

// leaseIntervals is how many sync intervals' worth of a limit's mean rate
// one lease holds at most, and minWindowIntervals how many sync intervals
// a limit's window must span for its keys to use the hot-key tier: so a
// lease is at most 2/40 = 5% of the limit.
const (
	leaseIntervals     = 2
	minWindowIntervals = 40
)

// HotKeyConfig configures the hot-key tier.
//
// # Detection
//
// Every check of cost above 0 increments a count-min sketch (4 rows of
// SketchWidth counters, lock-free) that is cleared every Window. A key
// whose estimate reaches Threshold x Window in one window becomes hot, up
// to MaxKeys hot keys at a time. A hot key checked fewer than half as
// often in a later window cools down: it leaves the tier, and its checks
// go to the store again. Memory is fixed: the sketch, plus one small
// record per hot key.
//
// # Leases
//
// A hot key's checks are admitted in process from a lease: units of the
// key's limit consumed in the store ahead of time, by an ordinary request
// of cost n, so the store's count never exceeds the limit. Every
// SyncInterval (and early, at most four times an interval, when a lease
// runs dry) one batched store call tops up each hot key's lease to the
// demand of an interval (times 1.5), capped at
// 2 x SyncInterval x (limit / window) units; a lease expires after
// 2 x SyncInterval (and, for a fixed window, at the end of its window).
// When the lease is empty the check goes to the store as usual; when the
// store refused the last top-up (the key is over its limit), checks are
// denied in process until the next sync. A lease is taken under the
// params of the key's latest check and decides only checks under the same
// params: the priorities, tiers and overrides of a rule count on one key
// with different limits, so the others go to the store. A lease under
// other params that still holds units runs out or expires before the key
// leases under new ones.
//
// # Bound
//
// Checks admitted in process were counted by the store before they were
// admitted, at most one lease earlier. So over any interval the checks
// admitted on a key exceed what the store alone would have admitted by at
// most the units one instance holds in its lease when the interval starts:
// at most 2 x SyncInterval / window of the limit per instance. Keys whose
// limit has a window shorter than 40 x SyncInterval never use the tier, so
// this overshoot is at most 5% of the limit per instance (4% for a
// one-second window at the default 20 ms sync interval, 0.07% for a
// minute; docs/operations.md has the measured figures). For a fixed window
// a lease never outlives its window, and the overshoot is zero. Unused units of an
// expired lease are lost: a hot key may under-admit by up to one lease
// when its traffic stops.
type HotKeyConfig struct {
	// Enabled turns the tier on.
	Enabled bool
	// Threshold is the rate, in checks per second of one key, from which
	// the key is hot; zero means DefaultHotThreshold.
	Threshold float64
	// SyncInterval is how often hot keys' leases are topped up, between
	// 1 ms and 1 s; zero means DefaultHotSyncInterval.
	SyncInterval time.Duration
	// Window is the detection window; zero means DefaultHotWindow.
	// Threshold x Window must be at least 4 checks.
	Window time.Duration
	// MaxKeys bounds the hot keys; zero means DefaultHotMaxKeys.
	MaxKeys int
	// SketchWidth is the counters per row of the sketch, rounded up to a
	// power of two; zero means DefaultHotSketchWidth.
	SketchWidth int
}

// hotTier holds the sketch and the hot keys.
type hotTier struct {
	interval time.Duration
	window   time.Duration
	promote  int64 // checks in one window from which a key is hot
	maxKeys  int
	sketch   sketch

	keys atomic.Pointer[map[string]*hotKey]
	mu   sync.Mutex // serializes writers of keys

	lastSync atomic.Int64 // unix nanoseconds of the last successful sync
	obs      Observer
	// kick asks the sync loop for an early sync: a hot key's lease ran dry
	// while the store may still have room.
	kick chan struct{}
}

func newHotTier(c HotKeyConfig) (*hotTier, error) {
	if c.Threshold == 0 {
		c.Threshold = DefaultHotThreshold
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = DefaultHotSyncInterval
	}
	if c.Window == 0 {
		c.Window = DefaultHotWindow
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultHotMaxKeys
	}
	if c.SketchWidth == 0 {
		c.SketchWidth = DefaultHotSketchWidth
	}
	switch {
	case c.Threshold < 0 || math.IsNaN(c.Threshold) || math.IsInf(c.Threshold, 0):
		return nil, fmt.Errorf("guard: config: hot-key threshold must be a positive rate, got %v", c.Threshold)
	case c.SyncInterval < time.Millisecond || c.SyncInterval > time.Second:
		return nil, fmt.Errorf("guard: config: hot-key sync interval must be between 1ms and 1s, got %s", c.SyncInterval)
	case c.Window < 0:
		return nil, fmt.Errorf("guard: config: hot-key window must not be negative, got %s", c.Window)
	case c.MaxKeys < 0 || c.MaxKeys > 1<<16:
		return nil, fmt.Errorf("guard: config: hot-key max keys must be between 1 and 65536, got %d", c.MaxKeys)
	case c.SketchWidth < 0 || c.SketchWidth > 1<<24:
		return nil, fmt.Errorf("guard: config: hot-key sketch width must be between 1 and 2^24, got %d", c.SketchWidth)
	}
	promote := int64(math.Ceil(c.Threshold * c.Window.Seconds()))
	if promote < 4 {
		return nil, fmt.Errorf("guard: config: hot-key threshold x window must be at least 4 checks, got %v/s x %s", c.Threshold, c.Window)
	}
	t := &hotTier{interval: c.SyncInterval, window: c.Window, promote: promote, maxKeys: c.MaxKeys, obs: nopObserver{}, kick: make(chan struct{}, 1)}
	t.sketch.init(c.SketchWidth)
	return t, nil
}

// sketch is a count-min sketch of 4 rows with atomic counters.
type sketch struct {
	seed maphash.Seed
	mask uint32
	rows [4][]atomic.Uint32
}

func (s *sketch) init(width int) {
	w := 1
	for w < width {
		w <<= 1
	}
	s.seed = maphash.MakeSeed()
	s.mask = uint32(w - 1)
	for i := range s.rows {
		s.rows[i] = make([]atomic.Uint32, w)
	}
}

// add counts one check of key and returns the key's estimate.
func (s *sketch) add(key string) int64 {
	h := maphash.String(s.seed, key)
	h1, h2 := uint32(h), uint32(h>>32)|1
	est := uint32(math.MaxUint32)
	for i := range s.rows {
		v := s.rows[i][(h1+uint32(i)*h2)&s.mask].Add(1)
		est = min(est, v)
	}
	return int64(est)
}

func (s *sketch) clear() {
	for i := range s.rows {
		for j := range s.rows[i] {
			s.rows[i][j].Store(0)
		}
	}
}

// hotKey is the in-process state of one hot key.
type hotKey struct {
	key      string
	params   atomic.Pointer[algorithm.Params] // of the last check seen
	promoted time.Time                        // when the key became hot

	demand atomic.Int64 // cost seen since the last sync
	checks atomic.Int64 // checks seen in the current detection window

	mu sync.Mutex // guards the fields below
	// lease is the params the lease was taken under: only checks with
	// the same params are decided from it (the priorities, tiers and
	// overrides of a rule share the key with different limits).
	lease *algorithm.Params
	// gen counts the leases: it changes when a lease starts afresh (the
	// last one expired, or its params change), so that units taken from
	// one lease are never given back to the next.
	gen       uint64
	avail     int64     // leased units not yet admitted
	expires   time.Time // of the lease
	remaining int64     // the store's remaining after the last lease
	resetAt   time.Time
	// windowEnd is, for a fixed window, the end of the window the lease's
	// units were counted in, as measured from the top-up that last added
	// to it.
	windowEnd time.Time
	over      bool      // the store refused the last top-up
	overUntil time.Time // local denials stop then at the latest
	retryAt   time.Time // the store's retry-after for the refused top-up
}

// leaseVerdict says what the hot-key tier makes of a check.
type leaseVerdict uint8

const (
	leasePass  leaseVerdict = iota // not decided: go to the store
	leaseAdmit                     // admitted from the lease
	leaseDeny                      // denied: the key is over its limit
)

// eligible reports whether keys of p may use the tier.
func (t *hotTier) eligible(p *algorithm.Params) bool {
	return !p.DenyAll && p.Limit > 0 && p.WindowDuration() >= minWindowIntervals*t.interval
}

// leaseCap returns the largest lease for p.
func (t *hotTier) leaseCap(p *algorithm.Params) int64 {
	perInterval := float64(p.Limit) * float64(leaseIntervals*t.interval) / float64(p.WindowDuration())
	return max(1, min(p.Burst, int64(math.Ceil(perInterval))))
}

// observe counts a check of r and returns its hot key, or nil when the key
// is not hot.
func (t *hotTier) observe(r *store.Request) *hotKey {
	if m := t.keys.Load(); m != nil {
		if hk := (*m)[r.Key]; hk != nil {
			hk.demand.Add(r.Cost)
			hk.checks.Add(1)
			if hk.params.Load() != r.Params {
				hk.params.Store(r.Params)
			}
			return hk
		}
	}
	if t.sketch.add(r.Key) < t.promote || !t.eligible(r.Params) {
		return nil
	}
	return t.promoteKey(r)
}

// promoteKey makes r's key hot, unless MaxKeys are.
func (t *hotTier) promoteKey(r *store.Request) *hotKey {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.keys.Load()
	if old != nil {
		if hk := (*old)[r.Key]; hk != nil {
			return hk
		}
		if len(*old) >= t.maxKeys {
			return nil
		}
	}
	// A copy of the key: r.Key may be cut from a larger string, which
	// the tier would otherwise keep alive.
	key := strings.Clone(r.Key)
	hk := &hotKey{key: key, promoted: time.Now()}
	hk.params.Store(r.Params)
	// Until the first sync has seen an interval of demand, assume the
	// threshold rate.
	hk.demand.Store(int64(math.Ceil(float64(t.promote) * float64(t.interval) / float64(t.window))))
	m := make(map[string]*hotKey, 1+len(mapOrNil(old)))
	maps.Copy(m, mapOrNil(old))
	m[key] = hk
	t.keys.Store(&m)
	t.obs.HotKeyDetected()
	t.obs.HotKeys(len(m))
	return hk
}

func mapOrNil(m *map[string]*hotKey) map[string]*hotKey {
	if m == nil {
		return nil
	}
	return *m
}

// forget drops keys from the tier (their leases are lost).
func (t *hotTier) forget(keys []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.keys.Load()
	if old == nil {
		return
	}
	m := maps.Clone(*old)
	for _, k := range keys {
		delete(m, k)
	}
	t.keys.Store(&m)
	t.obs.HotKeys(len(m))
}

// cool ends a detection window: keys checked fewer than promote/2 times
// in it leave the tier, and the sketch starts over.
func (t *hotTier) cool() {
	t.sketch.clear()
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.keys.Load()
	if old == nil {
		return
	}
	m := make(map[string]*hotKey, len(*old))
	now := time.Now()
	for k, hk := range *old {
		// A key promoted during this window has not been counted for a
		// whole one yet: it stays.
		if hk.checks.Swap(0)*2 >= t.promote || now.Sub(hk.promoted) < t.window {
			m[k] = hk
		}
	}
	if len(m) != len(*old) {
		t.keys.Store(&m)
		t.obs.HotKeys(len(m))
	}
}

// take admits cost from the lease, or denies while the key is over its
// limit, or passes. A check under params other than the lease's passes.
// An admitted check's units come from the lease gen.
func (hk *hotKey) take(p *algorithm.Params, cost int64, now time.Time) (_ sluice.Decision, gen uint64, _ leaseVerdict) {
	hk.mu.Lock()
	defer hk.mu.Unlock()
	if p != hk.lease {
		return sluice.Decision{}, 0, leasePass
	}
	if !now.Before(hk.expires) {
		hk.avail = 0
	}
	if hk.avail >= cost {
		hk.avail -= cost
		return sluice.Decision{Allowed: true, Reason: sluice.ReasonAllowed, Limit: p.Limit,
			Remaining: min(p.Burst, hk.remaining+hk.avail), ResetAfter: max(0, hk.resetAt.Sub(now))}, hk.gen, leaseAdmit
	}
	if hk.over && now.Before(hk.overUntil) {
		retry := max(time.Millisecond, min(hk.retryAt.Sub(now), hk.overUntil.Sub(now)))
		return sluice.Decision{Reason: sluice.ReasonLimited, Limit: p.Limit, Remaining: hk.avail,
			RetryAfter: retry, ResetAfter: max(retry, hk.resetAt.Sub(now))}, 0, leaseDeny
	}
	return sluice.Decision{}, 0, leasePass
}

// giveBack returns cost, taken from the lease gen, to that lease, unless
// it has expired at now or another lease has replaced it: units counted
// in the store for one lease (for a fixed window, in one window) are never
// admitted from the next.
func (hk *hotKey) giveBack(cost int64, gen uint64, now time.Time) {
	hk.mu.Lock()
	if gen == hk.gen && now.Before(hk.expires) {
		hk.avail += cost
	}
	hk.mu.Unlock()
}

// dry tells the sync loop that a hot key's lease ran dry.
func (t *hotTier) dry() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// syncLoop tops up the leases every interval, and early (at most four
// times an interval) when a lease runs dry, and ends detection windows,
// until ctx ends.
func (g *Guard) syncLoop(ctx context.Context) {
	t := g.hot
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	lastCool := time.Now()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if now.Sub(lastCool) >= t.window {
				t.cool()
				lastCool = now
			}
			g.sync(ctx, now.Sub(last))
			last = now
		case <-t.kick:
			now := time.Now()
			if el := now.Sub(last); el >= t.interval/4 {
				g.sync(ctx, el)
				last = now
			}
		}
	}
}

// allIndexes returns 0, 1, ..., n-1.
func allIndexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// lease is one top-up request of a sync.
type lease struct {
	hk     *hotKey
	params *algorithm.Params
	need   int64
}

// sync tops up every hot key's lease in one batched store call (and one
// more for the keys the store could only partly serve), to 1.5 times the
// demand of an interval, measured over elapsed since the last sync. A
// lease is taken under the params of the key's last check; a lease under
// other params that still holds units is left to run out or expire
// first.
func (g *Guard) sync(ctx context.Context, elapsed time.Duration) {
	t := g.hot
	m := t.keys.Load()
	if m == nil || len(*m) == 0 {
		t.lastSync.Store(time.Now().UnixNano())
		return
	}
	now := g.now()
	var leases []lease
	for _, hk := range *m {
		demand := float64(hk.demand.Swap(0)) * float64(t.interval) / float64(max(elapsed, time.Millisecond))
		p := hk.params.Load()
		if !t.eligible(p) {
			continue
		}
		target := min(t.leaseCap(p), int64(math.Ceil(demand*1.5)))
		hk.mu.Lock()
		if !now.Before(hk.expires) {
			hk.avail = 0
		}
		need := target - hk.avail
		if hk.lease != p && hk.avail > 0 {
			need = 0
		}
		hk.mu.Unlock()
		if need > 0 {
			leases = append(leases, lease{hk, p, need})
		}
	}
	for round := 0; round < 2 && len(leases) > 0; round++ {
		leases = g.topUp(ctx, leases)
	}
}

// topUp asks the store for the leases and returns those to ask again,
// smaller, because the store had fewer units left than asked.
func (g *Guard) topUp(ctx context.Context, leases []lease) []lease {
	t := g.hot
	reqs := make([]store.Request, len(leases))
	out := make([]sluice.Decision, len(leases))
	for i, l := range leases {
		reqs[i] = store.Request{Key: l.hk.key, Params: l.params, Cost: l.need}
	}
	sent := g.now()
	g.stats.syncs.Add(1)
	started := time.Now()
	err := g.run(ctx, g.newJob(opSync, reqs, len(reqs)), out)
	t.obs.HotKeySyncCall(time.Since(started), err)
	// A store that decided some of the leases and not others (a node of
	// a cluster down) charged those it decided: they are kept.
	var failed []int
	if err != nil {
		g.stats.syncErrors.Add(1)
		var partial *store.PartialError
		if !errors.As(err, &partial) {
			partial = &store.PartialError{Failed: allIndexes(len(leases))}
		}
		failed = partial.Failed
	} else {
		now := time.Now()
		if prev := t.lastSync.Swap(now.UnixNano()); prev != 0 {
			t.obs.HotKeySync(now.Sub(time.Unix(0, prev)))
		}
	}
	var again []lease
	for i, l := range leases {
		d := &out[i]
		hk := l.hk
		if len(failed) > 0 && failed[0] == i {
			// The lease runs out on its own; checks then go to the store
			// and its failure handling.
			failed = failed[1:]
			hk.mu.Lock()
			hk.over = false
			hk.mu.Unlock()
			continue
		}
		hk.mu.Lock()
		if hk.lease != l.params {
			// A lease under new params: the units of the old one, if any,
			// were counted under other params and are dropped.
			hk.lease, hk.avail, hk.over = l.params, 0, false
			hk.gen++
		}
		hk.remaining = d.Remaining
		hk.resetAt = sent.Add(d.ResetAfter)
		if d.Allowed {
			ttl := min(leaseIntervals*t.interval, inQuantum(d.ResetAfter, l.params))
			// A top-up sent before a fixed window's end may be decided in
			// the next window: the units left of the lease were counted in
			// the last one, and are not admitted in this one.
			end := sent.Add(d.ResetAfter)
			later := l.params.Algorithm == sluice.FixedWindow && end.Sub(hk.windowEnd) > l.params.WindowDuration()/2
			if !sent.Before(hk.expires) || later {
				hk.avail = 0
				hk.gen++ // a new lease, not an extension of the last
			}
			hk.windowEnd = end
			hk.avail += l.need
			hk.expires = sent.Add(ttl)
			hk.over = false
		} else if d.Remaining > 0 && d.Remaining < l.need {
			again = append(again, lease{hk, l.params, d.Remaining})
		} else {
			hk.over = hk.avail == 0
			hk.overUntil = sent.Add(leaseIntervals * t.interval)
			hk.retryAt = sent.Add(d.RetryAfter)
		}
		hk.mu.Unlock()
	}
	return again
}
