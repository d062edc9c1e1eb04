// Package redispool keeps the pools of reservations of capacity in Redis or
// Redis Cluster: a reserve.Backend that every instance sharing the Redis
// shares, so that any instance can grant, use, release or expire any
// reservation, and an instance that dies loses nothing.
//
// # One script per operation
//
// Each operation on a pool (reserve, get, use, release or cancel, sweep,
// peek) is one Lua script, run with EVALSHA (EVAL after a NOSCRIPT): one
// round trip and one atomic step in Redis, so that a pool of capacity C
// never holds more than C tokens whoever races. The scripts are pool.lua,
// the state and the transitions of package reservation ported integer for
// integer, followed by the operation's own file; their comments give the
// key layout and the replies. Every key of a pool carries the pool's
// handle as hash tag, so that on a cluster a pool lives in one slot.
//
// # Time
//
// The scripts take the instant as an argument, as the transitions of
// package reservation do, so that tests choose it and the differential
// test runs the same instants through both; an instant of zero (the
// Keeper's when it has no clock of its own) makes the script read the
// Redis server's clock (TIME), one clock for every instance, so that
// expiry and aging do not depend on whose clock is ahead. A pool's time
// never goes back: a call is decided at the latest instant the pool has
// seen.
//
// # Expiry
//
// Every script expires what is due in its pool first, so a reservation
// whose instance died expires at the pool's next call, whoever makes it.
// Sweep visits the pools of a registry (a sorted set of handles, scored by
// the second each was last registered) so that expiries are reported and
// queued requests granted when a pool sees no call; Reserve registers its
// pool at most once every registerEvery (10 s) per instance, and the
// sweep removes a pool it finds idle (deleted by the script) only if its
// last registration is over forgetAfter (a minute) old, checked and
// removed in one script, so a pool in use is never dropped from the
// registry.
//
// # Failures
//
// Every error of Redis or of the connection wraps
// sluice.ErrStoreUnavailable. A call that Redis Cluster refuses with
// TRYAGAIN (a slot moving between masters, some of the pool's keys moved
// and some not) is refused before it runs, and is sent again after a
// pause while its context allows; nothing else is sent twice.
package redispool

import (
	"cmp"
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/keyspace"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

var (
	//go:embed pool.lua
	poolSource string
	//go:embed reserve.lua
	reserveSource string
	//go:embed get.lua
	getSource string
	//go:embed use.lua
	useSource string
	//go:embed release.lua
	releaseSource string
	//go:embed sweep.lua
	sweepSource string
	//go:embed peek.lua
	peekSource string
	//go:embed unregister.lua
	unregisterSource string

	reserveScript    = newScript(poolSource + reserveSource)
	getScript        = newScript(poolSource + getSource)
	useScript        = newScript(poolSource + useSource)
	releaseScript    = newScript(poolSource + releaseSource)
	sweepScript      = newScript(poolSource + sweepSource)
	peekScript       = newScript(poolSource + peekSource)
	unregisterScript = newScript(unregisterSource)
)

// Registry timing: a Reserve registers its pool again once its last
// registration by this instance is registerEvery old; the sweep drops an
// idle pool registered more than forgetAfter ago (far above
// registerEvery, so that clocks a little apart agree).
const (
	registerEvery = 10 * time.Second
	forgetAfter   = time.Minute
)

// Config configures Pools.
type Config struct {
	// Client is the connection to Redis or Redis Cluster; required. The
	// Pools does not close it.
	Client rueidis.Client
	// Prefix is put before every key.
	Prefix string
}

// Pools is a reserve.Backend on Redis. Create it with New; it is safe for
// concurrent use.
type Pools struct {
	client   rueidis.Client
	prefix   string
	registry string

	mu         sync.Mutex
	registered map[string]time.Time // when this instance last registered a pool; guarded by mu
	queues     map[string]int64     // the queue length each pool last had; guarded by mu
}

// New returns the Pools of cfg.
func New(cfg Config) (*Pools, error) {
	if cfg.Client == nil {
		return nil, errors.New("redispool: Config.Client is required")
	}
	return &Pools{
		client:     cfg.Client,
		prefix:     cfg.Prefix,
		registry:   keyspace.PoolRegistry(cfg.Prefix),
		registered: make(map[string]time.Time),
		queues:     make(map[string]int64),
	}, nil
}

// keys returns the keys of the pool of handle, in pool.lua's order.
func (p *Pools) keys(handle string) []string { return keyspace.PoolKeys(p.prefix, handle) }

// instant is the scripts' argument for now: -1 for the server's clock.
func instant(now int64) string {
	if now == 0 {
		return "-1"
	}
	return strconv.FormatInt(now, 10)
}

// Reserve implements reserve.Backend.
func (p *Pools) Reserve(ctx context.Context, pool *reserve.Pool, now int64, a reservation.Ask, secret string) (reservation.Result, []reserve.Effect, error) {
	c := &pool.Config
	args := []string{instant(now), secret, a.Client, itoa(a.Tokens), itoa(a.Duration), itoa(int64(a.Priority)),
		pool.Rule, pool.Resource, ""}
	conf := []string{itoa(c.Capacity), itoa(c.QueueLimit), itoa(c.AgingPeriod), itoa(c.MaxDuration),
		itoa(c.Default.Weight), itoa(c.Default.MinGuaranteed), itoa(c.Default.MaxBurst), strconv.Itoa(len(c.Quotas))}
	for _, name := range slices.Sorted(maps.Keys(c.Quotas)) {
		q := c.Quotas[name]
		conf = append(conf, name, itoa(q.Weight), itoa(q.MinGuaranteed), itoa(q.MaxBurst))
	}
	args[8] = signature(conf)
	args = append(args, conf...)
	r, err := p.run(ctx, reserveScript, pool.Handle, args, p.register(pool.Handle))
	if err != nil {
		return reservation.Result{}, nil, err
	}
	fx, err := r.head()
	if err != nil {
		return reservation.Result{}, fx, err
	}
	var res reservation.Result
	res.Granted = r.int() == 1
	res.Position, res.ExpiresAt, res.EstimatedAt = r.int(), r.int(), r.int()
	return res, fx, r.done()
}

// signature is the configuration's signature, by which a script knows
// it has it already.
func signature(conf []string) string {
	h := sha1.Sum([]byte(strings.Join(conf, "\x00")))
	return hex.EncodeToString(h[:8])
}

// register returns the command that registers the pool of handle for the
// sweep, or an empty one when this instance registered it lately.
func (p *Pools) register(handle string) rueidis.Completed {
	now := time.Now()
	p.mu.Lock()
	last, ok := p.registered[handle]
	fresh := ok && now.Sub(last) < registerEvery
	if !fresh {
		p.registered[handle] = now
	}
	p.mu.Unlock()
	if fresh {
		return rueidis.Completed{}
	}
	return p.client.B().Zadd().Key(p.registry).ScoreMember().ScoreMember(float64(now.Unix()), handle).Build()
}

// Get implements reserve.Backend.
func (p *Pools) Get(ctx context.Context, handle, secret, client string, now int64) (reserve.Record, []reserve.Effect, error) {
	return p.record(ctx, getScript, handle, []string{instant(now), secret, client})
}

// Use implements reserve.Backend.
func (p *Pools) Use(ctx context.Context, handle, secret, client string, now, n int64) (reserve.Record, []reserve.Effect, error) {
	return p.record(ctx, useScript, handle, []string{instant(now), secret, client, itoa(n)})
}

// record runs get.lua or use.lua and reads the record they answer.
func (p *Pools) record(ctx context.Context, s *script, handle string, args []string) (reserve.Record, []reserve.Effect, error) {
	r, err := p.run(ctx, s, handle, args, rueidis.Completed{})
	if err != nil {
		return reserve.Record{}, nil, err
	}
	fx, err := r.head()
	if err != nil {
		return reserve.Record{}, fx, err
	}
	r.int() // found: always, when the code is 0
	rec := reserve.Record{Client: r.str(), Rule: r.rule, Resource: r.resource}
	rec.Queued = r.int() == 1
	rec.Position, rec.EstimatedAt = r.int(), r.int()
	rec.Tokens, rec.Balance, rec.InUse = r.int(), r.int(), r.int()
	rec.GrantedAt, rec.ExpiresAt = r.int(), r.int()
	return rec, fx, r.done()
}

// Release implements reserve.Backend.
func (p *Pools) Release(ctx context.Context, handle, secret, client string, now int64) (reserve.Ended, []reserve.Effect, error) {
	r, err := p.run(ctx, releaseScript, handle, []string{instant(now), secret, client}, rueidis.Completed{})
	if err != nil {
		return reserve.Ended{}, nil, err
	}
	fx, err := r.head()
	if err != nil {
		return reserve.Ended{}, fx, err
	}
	end := reserve.Ended{State: r.str(), Returned: r.int()}
	if end.State == "released" {
		// The release comes between the grants before it and after it.
		before := r.int()
		i := len(fx) - r.granted + int(before)
		rel := reserve.Effect{Type: events.ReservationReleased, Secret: secret, Client: r.str(),
			Rule: r.rule, Resource: r.resource, Tokens: end.Returned}
		fx = slices.Insert(fx, i, rel)
	}
	return end, fx, r.done()
}

// Peek implements reserve.Backend. For a client's place in the queue it
// answers from the queue length the pool last had here, without a round
// trip, when that was 0: a request queued through another instance since
// shows from the next sweep (Config.SweepEvery of the Keeper) on.
func (p *Pools) Peek(ctx context.Context, handle, client string, now int64) (reserve.Peeked, error) {
	if client != "" {
		p.mu.Lock()
		n := p.queues[handle]
		p.mu.Unlock()
		if n == 0 {
			return reserve.Peeked{}, nil
		}
	}
	r, err := p.run(ctx, peekScript, handle, []string{instant(now), client}, rueidis.Completed{})
	if err != nil {
		return reserve.Peeked{}, err
	}
	if _, err := r.head(); err != nil {
		return reserve.Peeked{}, err
	}
	pk := reserve.Peeked{Held: r.int(), Capacity: r.int(), Position: r.int(), EstimatedAt: r.int()}
	return pk, r.done()
}

// sweepBatch is the most sweep.lua calls sent in one round trip.
const sweepBatch = 128

// Sweep implements reserve.Backend: sweep.lua on every registered pool,
// sweepBatch calls a round trip.
func (p *Pools) Sweep(ctx context.Context, now int64) ([]reserve.Effect, error) {
	c := p.client
	entries, err := c.Do(ctx, c.B().Zrange().Key(p.registry).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		return nil, p.unavailable(err)
	}
	p.prune()
	cutoff := float64(time.Now().Add(-forgetAfter).Unix())
	args := []string{instant(now)}
	var fx []reserve.Effect
	var first error
	for len(entries) > 0 {
		batch := entries[:min(len(entries), sweepBatch)]
		entries = entries[len(batch):]
		cmds := make(rueidis.Commands, len(batch))
		for i, e := range batch {
			cmds[i] = p.call(sweepScript, e.Member, args, false)
		}
		for i, res := range c.DoMulti(ctx, cmds...) {
			e := batch[i]
			r, err := p.settle(ctx, sweepScript, e.Member, args, res)
			if err == nil {
				var more []reserve.Effect
				more, err = r.head()
				fx = append(fx, more...)
				if err == nil && r.int() == 1 && e.Score <= cutoff {
					err = p.unregister(ctx, e.Member, cutoff)
				}
			}
			first = cmp.Or(first, err)
		}
	}
	return fx, first
}

// prune forgets the registrations too old to count (the next Reserve of
// their pools registers them again), so that the map holds only recent
// pools.
func (p *Pools) prune() {
	old := time.Now().Add(-registerEvery)
	p.mu.Lock()
	for h, at := range p.registered {
		if at.Before(old) {
			delete(p.registered, h)
		}
	}
	p.mu.Unlock()
}

// unregister removes handle from the registry unless registered again
// after cutoff.
func (p *Pools) unregister(ctx context.Context, handle string, cutoff float64) error {
	c := p.client
	args := []string{handle, strconv.FormatInt(int64(cutoff), 10)}
	err := c.Do(ctx, c.B().Evalsha().Sha1(unregisterScript.sha).Numkeys(1).Key(p.registry).Arg(args...).Build()).Error()
	if e, ok := rueidis.IsRedisErr(err); ok && e.IsNoScript() {
		err = c.Do(ctx, c.B().Eval().Script(unregisterScript.src).Numkeys(1).Key(p.registry).Arg(args...).Build()).Error()
	}
	if err != nil {
		return p.unavailable(err)
	}
	return nil
}

// noteQueue keeps the queue length a pool answered with.
func (p *Pools) noteQueue(handle string, n int64) {
	p.mu.Lock()
	if n == 0 {
		delete(p.queues, handle)
	} else {
		p.queues[handle] = n
	}
	p.mu.Unlock()
}

// unavailable wraps an error of the client.
func (p *Pools) unavailable(err error) error {
	return fmt.Errorf("redispool: %w: %w", sluice.ErrStoreUnavailable, err)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
