// Package limiter is Sluice as a library: one rate limit applied to any
// number of keys (users, IP addresses, API keys), in process memory
// (Limiter) or in Redis, shared by every process that uses it (Redis).
//
//	lim, err := limiter.New(sluice.Limit{
//		Algorithm: sluice.SlidingWindowCounter,
//		Limit:     100,
//		Window:    time.Minute,
//	}, limiter.Config{})
//	...
//	if !lim.Allow(userID) {
//		// answer 429 Too Many Requests
//	}
//
// Each key has its own state; a Limiter keeps at most Config.MaxKeys of them
// and forgets the least recently used first (see package store/memory for
// the memory each costs). Time is a parameter: AllowAt, AllowN and DecideAt
// decide at the instant they are given, so tests and replays pick it, and
// Allow is the wall-clock shorthand. A Limiter is safe for concurrent use;
// checks of different keys rarely contend, as the keys are spread over
// independently locked shards, and a check does not allocate (except for
// the sliding window log, whose log may need to grow).
//
// # Redis
//
// NewRedis makes the same limiter over Redis or Redis Cluster from an
// existing rueidis client, in one line:
//
//	lim, err := limiter.NewRedis(client, limiter.PerMinute(100))
//	...
//	ok, err := lim.Allow(ctx, userID)
//
// Its methods take a context and return an error, since each check is a
// network call: one Lua script call, one atomic step in Redis, so that a
// limit of n admits exactly n across every process sharing it. Checks are
// decided at the Redis server's clock. When Redis cannot answer, a check
// returns false and an error wrapping sluice.ErrStoreUnavailable; the
// caller chooses to fail open or closed.
//
// Both limiters have Decide(ctx, key, n), which package httplimit uses to
// rate-limit an http.Handler with either.
//
// # Reserve and Wait
//
// As in golang.org/x/time/rate, Reserve takes units that are not there yet
// and says how long to wait for them (Reservation.Delay), and Wait sleeps
// until they are there:
//
//	r := lim.Reserve(key)  // or lim.Reserve(ctx, key) on Redis
//	time.Sleep(r.Delay())
//	err := lim.Wait(ctx, key)
//
// On Redis a reservation is made in Redis, one atomic step, so it holds
// across every process sharing the limit. It holds exactly on GCRA, the
// algorithm of PerSecond, PerMinute and PerHour; the Reservation type says
// what it holds on the others, and why there is no Cancel.
package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// Config holds the knobs of a Limiter. The zero value is usable: every zero
// field takes its default.
type Config struct {
	// MaxKeys is the most keys the limiter remembers; a new key beyond it
	// makes the limiter forget the least recently used one. Zero means
	// memory.DefaultMaxKeys (about a million).
	MaxKeys int
	// Shards is the number of independently locked parts of the key space;
	// see memory.Config. Zero means memory.DefaultShards.
	Shards int
	// MaxLogEntries caps the limit of a sliding window log; see
	// memory.Config. Zero means memory.DefaultMaxLogEntries.
	MaxLogEntries int64
	// Now is the clock of Allow and of a zero time passed to the other
	// methods. Nil means time.Now.
	Now func() time.Time
}

// Limiter applies one limit to many keys. Create it with New; it is safe for
// concurrent use.
type Limiter struct {
	limit  sluice.Limit
	params algorithm.Params
	store  *memory.Store
	now    func() time.Time
}

// New returns a Limiter that applies l to every key. An invalid limit fails
// here, with the errors of algorithm.Compile (wrapping
// sluice.ErrInvalidLimit and naming the field); so does a sliding window log
// whose limit is above Config.MaxLogEntries (wrapping memory.ErrLogTooLarge).
func New(l sluice.Limit, cfg Config) (*Limiter, error) {
	p, err := algorithm.Compile(l)
	if err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	st, err := memory.New(memory.Config{
		MaxKeys:       cfg.MaxKeys,
		Shards:        cfg.Shards,
		MaxLogEntries: cfg.MaxLogEntries,
		Now:           now,
	})
	if err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	if err := st.Accepts(&p); err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	return &Limiter{limit: l, params: p, store: st, now: now}, nil
}

// Limit returns the limit lim applies.
func (lim *Limiter) Limit() sluice.Limit { return lim.limit }

// Allow reports whether one request for key may go through now, by the
// Config's clock, and if so consumes it.
func (lim *Limiter) Allow(key string) bool {
	return lim.DecideAt(key, lim.now(), 1).Allowed
}

// AllowAt reports whether one request for key may go through at t, and if
// so consumes it. A zero t means now, by the Config's clock.
func (lim *Limiter) AllowAt(key string, t time.Time) bool {
	return lim.DecideAt(key, t, 1).Allowed
}

// AllowN reports whether a request of cost n for key may go through at t,
// and if so consumes n units. n = 0 consumes nothing and is allowed but
// by a deny-all limit (DecideAt(key, t, 0).Remaining tells whether the
// limit is exhausted); a negative n is never allowed. A zero t means now.
func (lim *Limiter) AllowN(key string, t time.Time, n int64) bool {
	return lim.DecideAt(key, t, n).Allowed
}

// DecideAt decides a request of cost n for key at t and returns the whole
// decision: allowed, remaining, when the limit is restored and when to
// retry. A zero t means now. A negative n is denied without consuming
// anything, with ReasonCostExceedsCapacity.
func (lim *Limiter) DecideAt(key string, t time.Time, n int64) sluice.Decision {
	if n < 0 {
		return sluice.Decision{Reason: sluice.ReasonCostExceedsCapacity, Limit: lim.params.Limit}
	}
	d, err := lim.store.Decide(store.Request{Key: key, Params: &lim.params, Cost: n, Now: t})
	if err != nil {
		// Unreachable: the params were accepted by New, n is not
		// negative, and the store is never closed. Deny rather than admit.
		return sluice.Decision{Reason: sluice.ReasonLimited, Limit: lim.params.Limit}
	}
	return d
}

// Decide decides a request of cost n for key now, by the Config's clock,
// as DecideAt does. It has the signature of Redis.Decide, so that code
// taking either limiter (such as package httplimit) takes both; the memory
// limiter never fails and does no I/O, so it ignores ctx and its error is
// always nil.
func (lim *Limiter) Decide(ctx context.Context, key string, n int64) (sluice.Decision, error) {
	return lim.DecideAt(key, time.Time{}, n), nil
}

// Reset forgets the state of key: its next request is decided as its
// first.
func (lim *Limiter) Reset(key string) {
	// Reset of the memory store fails only when the store is closed or the
	// context done, and neither can happen here.
	_ = lim.store.Reset(context.Background(), key)
}

// Len returns the number of keys lim remembers.
func (lim *Limiter) Len() int { return lim.store.Len() }
