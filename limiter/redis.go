package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// DefaultRedisPrefix is put before every key of a Redis limiter made
// without WithPrefix.
const DefaultRedisPrefix = "sluice:limiter:"

// PerSecond returns a limit of n requests per second with bursts of up to n,
// on GCRA: the semantics of redis_rate.PerSecond and of a token bucket
// (rate.NewLimiter(n, n)). Change its fields for another algorithm or burst;
// for at most n in any window, set Algorithm to sluice.SlidingWindowCounter.
func PerSecond(n int64) sluice.Limit { return per(n, time.Second) }

// PerMinute returns a limit of n requests per minute with bursts of up to n,
// on GCRA; see PerSecond.
func PerMinute(n int64) sluice.Limit { return per(n, time.Minute) }

// PerHour returns a limit of n requests per hour with bursts of up to n, on
// GCRA; see PerSecond.
func PerHour(n int64) sluice.Limit { return per(n, time.Hour) }

func per(n int64, window time.Duration) sluice.Limit {
	return sluice.Limit{Algorithm: sluice.GCRA, Limit: n, Window: window}
}

// RedisOption changes a default of NewRedis.
type RedisOption func(*redisOptions)

type redisOptions struct {
	prefix  string
	timeout time.Duration
}

// WithPrefix sets the prefix put before every key in Redis (default
// DefaultRedisPrefix). Limiters with different limits that share a Redis
// need different prefixes: a key holds the state of one limit, and a
// limiter reads another's as its own.
func WithPrefix(p string) RedisOption { return func(o *redisOptions) { o.prefix = p } }

// WithTimeout bounds each call whose context has no deadline (default
// redis.DefaultTimeout, one second). A context's own deadline always wins.
func WithTimeout(d time.Duration) RedisOption { return func(o *redisOptions) { o.timeout = d } }

// Redis applies one limit to many keys, keeping their state in Redis or
// Redis Cluster, so that every process sharing the Redis shares the
// limit, exactly: each check is one Lua script call, one atomic step in
// Redis, so a limit of n admits exactly n however many callers race.
// Create it with NewRedis; it is safe for concurrent use.
//
// Unlike the memory Limiter, every method takes a context and returns an
// error: a check is a network call, bounded by the context's deadline (or
// by WithTimeout when it has none). When Redis is down, unreachable or too
// slow, the check returns false (deny) with an error wrapping
// sluice.ErrStoreUnavailable; whether to admit the request anyway (fail
// open) is the caller's choice, as in package httplimit.
//
// Checks are decided at the Redis server's clock, so that processes agree
// whatever their own clocks say; DecideAt takes an instant for tests and
// replays.
type Redis struct {
	limit  sluice.Limit
	params algorithm.Params
	store  *redis.Store
}

// NewRedis returns a limiter that applies l to every key, with its state
// in the Redis that client talks to (a standalone server or a cluster).
// The client stays the caller's: the limiter never closes it, and holds no
// other resources. NewRedis makes no network call on a standalone server,
// so it succeeds while Redis is down; the checks then fail. An invalid
// limit fails here, with the errors of algorithm.Compile (wrapping
// sluice.ErrInvalidLimit and naming the field), as does a sliding window
// log above redis.DefaultMaxLogEntries.
//
// A go-redis user can keep go-redis for everything else and give the
// limiter a rueidis client on the same address; both share the Redis.
func NewRedis(client rueidis.Client, l sluice.Limit, opts ...RedisOption) (*Redis, error) {
	if client == nil {
		return nil, errors.New("limiter: redis client: must not be nil")
	}
	p, err := algorithm.Compile(l)
	if err != nil {
		return nil, err
	}
	o := redisOptions{prefix: DefaultRedisPrefix}
	for _, opt := range opts {
		opt(&o)
	}
	if o.timeout < 0 {
		return nil, fmt.Errorf("limiter: timeout: must not be negative, got %s", o.timeout)
	}
	st, err := redis.New(redis.Config{Client: client, Prefix: o.prefix, Timeout: o.timeout})
	if err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	if err := st.Accepts(&p); err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	return &Redis{limit: l, params: p, store: st}, nil
}

// Limit returns the limit lim applies.
func (lim *Redis) Limit() sluice.Limit { return lim.limit }

// Allow reports whether one request for key may go through now, and if so
// consumes it. When Redis cannot answer it returns false and an error
// wrapping sluice.ErrStoreUnavailable.
func (lim *Redis) Allow(ctx context.Context, key string) (bool, error) {
	d, err := lim.DecideAt(ctx, key, time.Time{}, 1)
	return d.Allowed, err
}

// AllowN reports whether a request of cost n for key may go through now,
// and if so consumes n units. n = 0 consumes nothing; a negative n is
// never allowed. Errors are those of Allow.
func (lim *Redis) AllowN(ctx context.Context, key string, n int64) (bool, error) {
	d, err := lim.DecideAt(ctx, key, time.Time{}, n)
	return d.Allowed, err
}

// Decide decides a request of cost n for key now and returns the whole
// decision: allowed, remaining, when the limit is restored and when to
// retry. Errors are those of Allow; the decision then denies.
func (lim *Redis) Decide(ctx context.Context, key string, n int64) (sluice.Decision, error) {
	return lim.DecideAt(ctx, key, time.Time{}, n)
}

// DecideAt is Decide at the instant t; a zero t means now, by the Redis
// server's clock. Processes sharing a key should let Redis pick the time
// (a zero t): instants from clocks that disagree make the state jump. A
// negative n is denied without a call, with ReasonCostExceedsCapacity.
func (lim *Redis) DecideAt(ctx context.Context, key string, t time.Time, n int64) (sluice.Decision, error) {
	denied := sluice.Decision{Reason: sluice.ReasonLimited, Limit: lim.params.Limit}
	if n < 0 {
		denied.Reason = sluice.ReasonCostExceedsCapacity
		return denied, nil
	}
	var out [1]sluice.Decision
	req := [1]store.Request{{Key: key, Params: &lim.params, Cost: n, Now: t}}
	if err := lim.store.Check(ctx, req[:], out[:]); err != nil {
		return denied, fmt.Errorf("limiter: %w", err)
	}
	return out[0], nil
}

// Reset forgets the state of key: its next request is decided as its
// first.
func (lim *Redis) Reset(ctx context.Context, key string) error {
	if err := lim.store.Reset(ctx, key); err != nil {
		return fmt.Errorf("limiter: %w", err)
	}
	return nil
}
