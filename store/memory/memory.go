// Package memory is Sluice's in-process store: the state of every key in
// this process's memory, sharded so that checks of different keys rarely
// contend, and bounded so that millions of keys fit in a known budget.
//
// # Layout
//
// The store is split into a power-of-two number of shards, each guarded by
// its own mutex; a key belongs to the shard picked by the high bits of its
// 64-bit hash. A shard never stores the key itself: its index maps the hash
// of the key (hash/maphash, with a random seed per store so that clients
// cannot choose colliding keys) to an entry of 48 bytes,
//
//	hash uint64 | expiresAt int64 | state (3 x int64) | prev, next uint32
//
// kept in an arena of fixed-size chunks (no slack from append doubling)
// and found through an open-addressing table of uint32 slot numbers. At a
// million keys this comes to about 60 bytes per key for every algorithm but
// the sliding window log, whatever the length of the keys; BenchmarkMemory in
// the bench module measures it.
//
// Keying by hash has one consequence: two keys whose 64-bit hashes collide
// (probability about n²/2⁶⁵ for n keys, so about 3·10⁻⁸ at a million keys)
// share one state. Sharing a state can only make the limiter deny more,
// never admit more than the limit of either key.
//
// # Bounded memory
//
// Config.MaxKeys bounds the number of keys, divided evenly between the
// shards. Inserting a key into a full shard evicts the shard's least
// recently used key, so eviction is exactly least-recently-used within a
// shard and approximately so across the store. Every check of a key,
// admitted or not, counts as a use.
//
// State whose limit is fully restored is equivalent to no state at all
// (algorithm.ExpiresAt says from when). It is reclaimed without ever
// scanning the store: each insertion first frees up to two entries expired
// for a second at the least recently used end of its shard, and reuses
// their room. Freed
// entries are reused by later insertions; the arena does not shrink.
//
// # Sliding window log
//
// The sliding window log keeps one timestamp (8 bytes) per unit of cost
// admitted in the last window, so a key costs O(limit) memory: up to
// 8 x limit bytes on top of its entry, plus about 50 bytes of bookkeeping.
// Config.MaxLogEntries caps the limit such a key may have; requests with a
// larger limit are refused with an error wrapping ErrLogTooLarge. The
// sliding window counter approximates the log in constant memory and is the
// algorithm to use for large limits.
//
// # Concurrency
//
// A Store is safe for concurrent use. Every check of a key is one critical
// section of its shard's mutex, and the mutex is never held across anything
// but the arithmetic of the check and the bookkeeping of the shard.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Defaults for the zero fields of a Config.
const (
	// DefaultMaxKeys is the key bound of a store whose Config.MaxKeys is 0:
	// 2^20 keys, about 64 MB for the constant-size algorithms.
	DefaultMaxKeys = 1 << 20
	// DefaultShards is the number of shards of a store whose Config.Shards
	// is 0.
	DefaultShards = 64
	// DefaultMaxLogEntries is the largest limit a sliding window log may
	// have in a store whose Config.MaxLogEntries is 0: at most 80 KB of log
	// per key.
	DefaultMaxLogEntries = 10_000
)

// Errors of the memory store. Test for them with errors.Is.
var (
	// ErrClosed is returned by every method of a closed store. It wraps
	// sluice.ErrStoreUnavailable.
	ErrClosed = fmt.Errorf("%w: memory store closed", sluice.ErrStoreUnavailable)
	// ErrLogTooLarge reports a sliding window log whose limit is above the
	// store's Config.MaxLogEntries. Errors wrapping it also wrap
	// sluice.ErrInvalidLimit.
	ErrLogTooLarge = store.ErrLogTooLarge
	// ErrShortOutput reports an output slice shorter than the requests.
	ErrShortOutput = errors.New("sluice: output shorter than requests")
)

// Config holds the knobs of a Store. The zero value is usable: every zero
// field takes its default.
type Config struct {
	// MaxKeys is the most keys the store keeps. A new key beyond it evicts
	// the least recently used key of its shard. Zero means DefaultMaxKeys.
	MaxKeys int
	// Shards is the number of independently locked parts of the store,
	// rounded up to a power of two; more shards mean less contention
	// between goroutines checking different keys. It is lowered for small
	// MaxKeys so that every shard holds at least 8 keys. Zero means
	// DefaultShards.
	Shards int
	// Now is the clock used for requests whose Now is zero. Nil means
	// time.Now.
	Now func() time.Time
	// MaxLogEntries is the largest limit a sliding window log may have in
	// this store: such a key keeps up to that many 8-byte timestamps.
	// Requests above it fail with an error wrapping ErrLogTooLarge. Zero
	// means DefaultMaxLogEntries.
	MaxLogEntries int64
}

// Store keeps the state of rate limits in process memory. Create it with
// New; it is safe for concurrent use.
type Store struct {
	seed      maphash.Seed
	now       func() time.Time
	maxLog    int64
	shardBits uint
	shards    []shard
	closed    atomic.Bool
}

// New returns an empty store configured by cfg. Its errors name the
// offending field.
func New(cfg Config) (*Store, error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("memory: max keys: must not be negative, got %d", cfg.MaxKeys)
	}
	if cfg.Shards < 0 {
		return nil, fmt.Errorf("memory: shards: must not be negative, got %d", cfg.Shards)
	}
	if cfg.MaxLogEntries < 0 {
		return nil, fmt.Errorf("memory: max log entries: must not be negative, got %d", cfg.MaxLogEntries)
	}
	maxKeys := cfg.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeys
	}
	if maxKeys > maxKeysLimit {
		return nil, fmt.Errorf("memory: max keys: %d is above the maximum %d", maxKeys, maxKeysLimit)
	}
	n := cfg.Shards
	if n == 0 {
		n = DefaultShards
	}
	most := max(1, maxKeys/minKeysPerShard) // keep minKeysPerShard per shard
	n = min(n, 1<<16, most)
	shardBits := uint(bits.Len(uint(n - 1))) // round n up to a power of two
	if 1<<shardBits > most {
		shardBits--
	}
	s := &Store{
		seed:      maphash.MakeSeed(),
		now:       cfg.Now,
		maxLog:    cfg.MaxLogEntries,
		shardBits: shardBits,
		shards:    make([]shard, 1<<shardBits),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.maxLog == 0 {
		s.maxLog = DefaultMaxLogEntries
	}
	per, extra := maxKeys/len(s.shards), maxKeys%len(s.shards)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.capacity = per
		if i < extra {
			sh.capacity++
		}
		sh.order = uint32(i)
		sh.head, sh.tail, sh.free = nilSlot, nilSlot, nilSlot
	}
	return s, nil
}

const (
	// minKeysPerShard keeps small stores from having near-empty shards.
	minKeysPerShard = 8
	// maxKeysLimit keeps slot numbers of one shard within uint32.
	maxKeysLimit = 1 << 40
	// sweepMax is how many expired entries an insertion frees at most.
	sweepMax = 2
	// sweepMargin (µs) is how long past its expiry an entry is kept: the
	// instants of concurrent checks are read a little apart, and a clock
	// may step back, so a check at an instant earlier than another's must
	// still find the state that the later one found expired. The Redis
	// store keeps keys past their expiry for the same reason.
	sweepMargin = 1_000_000
)

// MaxLogEntries returns the largest limit a sliding window log may have in
// this store.
func (s *Store) MaxLogEntries() int64 { return s.maxLog }

// Info implements store.Store: one node, no idempotency records (the
// engine keeps them in process), one part per call.
func (s *Store) Info() store.Info { return store.Info{MaxLogEntries: s.maxLog} }

// Do implements store.Store: Check, or CheckAll when b.All. It ignores
// b.Once and b.Part (see Info) and reports store.SourceStore for every
// request.
func (s *Store) Do(ctx context.Context, b *store.Batch) error {
	clear(b.Sources) // store.SourceStore
	if b.All {
		return s.CheckAll(ctx, b.Reqs, b.Out)
	}
	return s.Check(ctx, b.Reqs, b.Out)
}

// Accepts reports whether the store can decide requests with p: nil when it
// can, an error wrapping sluice.ErrInvalidLimit otherwise (an unknown
// algorithm, or a sliding window log above MaxLogEntries, wrapping
// ErrLogTooLarge).
func (s *Store) Accepts(p *algorithm.Params) error {
	return store.CheckParams(p, s.maxLog)
}

// validate checks one request.
func (s *Store) validate(r *store.Request) error {
	if err := s.Accepts(r.Params); err != nil {
		return fmt.Errorf("memory: key %q: %w", r.Key, err)
	}
	if r.Cost < 0 {
		return fmt.Errorf("memory: key %q: %w: cost %d is negative", r.Key, sluice.ErrInvalidCost, r.Cost)
	}
	return nil
}

// micros returns t in microseconds since the Unix epoch, or the store's
// clock when t is zero.
func (s *Store) micros(t time.Time) int64 {
	if t.IsZero() {
		t = s.now()
	}
	return t.UnixMicro()
}

// instants returns the instant of r (its Now, or the store's clock) and
// the instant it is decided at, r.After later, both in microseconds since
// the Unix epoch. Entries expire by the first: a request decided ahead of
// time must not sweep away states that are still live now.
func (s *Store) instants(r *store.Request) (now, at int64) {
	now = s.micros(r.Now)
	return now, now + max(r.After, 0).Microseconds()
}

// shardOf returns the shard of hash h.
func (s *Store) shardOf(h uint64) *shard {
	if s.shardBits == 0 {
		return &s.shards[0]
	}
	return &s.shards[h>>(64-s.shardBits)]
}

// Decide decides one request. It is the allocation-free path of Check for
// every algorithm but the sliding window log, whose log may need to grow.
func (s *Store) Decide(req store.Request) (sluice.Decision, error) {
	if s.closed.Load() {
		return sluice.Decision{}, ErrClosed
	}
	if err := s.validate(&req); err != nil {
		return sluice.Decision{}, err
	}
	now, at := s.instants(&req)
	h := maphash.String(s.seed, req.Key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	d := sh.decide(h, req.Params, now, at, req.Cost)
	sh.mu.Unlock()
	return d, nil
}

// Check decides each request on its own, in order, and writes its decision
// to out[i]; a key that appears twice sees the effect of its first request.
// When a request is invalid (a negative cost wraps sluice.ErrInvalidCost,
// a bad Params or too long a log wraps sluice.ErrInvalidLimit) Check decides
// nothing and returns the error. out must be at least as long as reqs.
func (s *Store) Check(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if err := s.begin(ctx, reqs, out); err != nil {
		return err
	}
	for i := range reqs {
		r := &reqs[i]
		now, at := s.instants(r)
		h := maphash.String(s.seed, r.Key)
		sh := s.shardOf(h)
		sh.mu.Lock()
		out[i] = sh.decide(h, r.Params, now, at, r.Cost)
		sh.mu.Unlock()
	}
	return nil
}

// begin does the checks common to Check and CheckAll.
func (s *Store) begin(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
	}
	if len(out) < len(reqs) {
		return fmt.Errorf("memory: %w: %d decisions for %d requests", ErrShortOutput, len(out), len(reqs))
	}
	for i := range reqs {
		if err := s.validate(&reqs[i]); err != nil {
			return err
		}
	}
	return nil
}

// pending is one request of a CheckAll batch while it is being decided.
type pending struct {
	hash  uint64
	sh    *shard
	now   int64 // the store's instant, by which entries expire
	at    int64 // the instant the request is decided at (see instants)
	first int   // index of the first request of the batch with this hash

	// On the first request of each hash: the working state of the key.
	found bool
	slot  uint32
	state algorithm.State
	log   []int64
	dirty bool
}

// CheckAll decides reqs as one unit: when every request is admitted, all
// consume their cost; when any is denied, none consumes anything and every
// out[i].Allowed is false. A denied request reports its own decision; a
// request that alone would have been admitted reports the state of its key
// as it stands (Remaining before its cost) with ReasonLimited and a zero
// RetryAfter. A key that appears twice is decided on the state its first
// request leaves. The shards involved are locked together, in a fixed order,
// for the whole batch. Errors are those of Check.
func (s *Store) CheckAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if err := s.begin(ctx, reqs, out); err != nil {
		return err
	}
	var pbuf [8]pending
	var sbuf [8]*shard
	ps, locked := pbuf[:0], sbuf[:0]
	if len(reqs) > len(pbuf) {
		ps = make([]pending, 0, len(reqs))
		locked = make([]*shard, 0, len(reqs))
	}
	for i := range reqs {
		r := &reqs[i]
		h := maphash.String(s.seed, r.Key)
		p := pending{hash: h, sh: s.shardOf(h), first: i}
		p.now, p.at = s.instants(r)
		for j := range ps {
			if ps[j].hash == h {
				p.first = ps[j].first
				break
			}
		}
		ps = append(ps, p)
		locked = insertShard(locked, p.sh)
	}
	for _, sh := range locked {
		sh.mu.Lock()
	}
	defer func() {
		for i := len(locked) - 1; i >= 0; i-- {
			locked[i].mu.Unlock()
		}
	}()

	all := true
	for i := range reqs {
		r, p := &reqs[i], &ps[i]
		w := &ps[p.first]
		if p.first == i {
			w.slot, w.found = w.sh.lookup(w.hash)
			if w.found {
				if r.Params.Algorithm == sluice.SlidingWindowLog {
					w.log = append([]int64(nil), w.sh.logs[w.slot]...)
				} else {
					w.state = w.sh.entry(w.slot).state
				}
			}
		}
		if r.Params.Algorithm == sluice.SlidingWindowLog {
			var nl []int64
			nl, out[i] = algorithm.ApplyLog(r.Params, w.log, p.at, r.Cost)
			if out[i].Allowed && r.Cost > 0 {
				w.log, w.dirty = nl, true
			}
		} else {
			var ns algorithm.State
			ns, out[i] = algorithm.Apply(r.Params, w.state, p.at, r.Cost)
			if out[i].Allowed && r.Cost > 0 {
				w.state, w.dirty = ns, true
			}
		}
		all = all && out[i].Allowed
	}

	if !all {
		for i := range reqs {
			if !out[i].Allowed {
				continue
			}
			r := &reqs[i]
			out[i] = s.peek(ps[i].sh, ps[i].hash, r.Params, ps[i].at)
			out[i].Allowed, out[i].Reason, out[i].RetryAfter = false, sluice.ReasonLimited, 0
		}
		return nil
	}
	// Write the keys that exist first, so that inserting the new ones cannot
	// evict an entry this batch is about to write.
	for pass := 0; pass < 2; pass++ {
		for i := range ps {
			w := &ps[i]
			if w.first != i || !w.dirty || w.found != (pass == 0) {
				continue
			}
			r := &reqs[i]
			slot := w.slot
			if w.found {
				w.sh.touch(slot)
			} else {
				slot = w.sh.insert(w.hash, ps[i].now)
			}
			if r.Params.Algorithm == sluice.SlidingWindowLog {
				w.sh.setLog(slot, r.Params, w.log)
			} else {
				w.sh.setState(slot, r.Params, w.state)
			}
		}
	}
	return nil
}

// peek reads the state of key hash h with a cost of 0; requires sh.mu held.
func (s *Store) peek(sh *shard, h uint64, p *algorithm.Params, now int64) sluice.Decision {
	slot, ok := sh.lookup(h)
	if p.Algorithm == sluice.SlidingWindowLog {
		var log []int64
		if ok {
			log = append([]int64(nil), sh.logs[slot]...)
		}
		_, d := algorithm.ApplyLog(p, log, now, 0)
		return d
	}
	var st algorithm.State
	if ok {
		st = sh.entry(slot).state
	}
	_, d := algorithm.Apply(p, st, now, 0)
	return d
}

// insertShard adds sh to the sorted set of shards ss.
func insertShard(ss []*shard, sh *shard) []*shard {
	i := 0
	for i < len(ss) && shardLess(ss[i], sh) {
		i++
	}
	if i < len(ss) && ss[i] == sh {
		return ss
	}
	ss = append(ss, nil)
	copy(ss[i+1:], ss[i:])
	ss[i] = sh
	return ss
}

// shardLess orders shards by their place in the store's array: the fixed
// lock order of CheckAll.
func shardLess(a, b *shard) bool { return a.order < b.order }

// Reset forgets the state of keys: their next check is decided as the first.
// Keys the store does not hold are ignored.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
	}
	for _, k := range keys {
		h := maphash.String(s.seed, k)
		sh := s.shardOf(h)
		sh.mu.Lock()
		if slot, ok := sh.lookup(h); ok {
			sh.remove(slot)
		}
		sh.mu.Unlock()
	}
	return nil
}

// Len returns the number of keys the store holds, including keys whose
// state has expired but has not been reclaimed yet.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Close releases the store's memory. Every later call returns ErrClosed.
// Close is idempotent.
func (s *Store) Close() error {
	s.closed.Store(true)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.clear()
		sh.mu.Unlock()
	}
	return nil
}
