// Package reserve serves reservations of capacity: a Keeper matches a
// reservation to its pool under the policy in force, names it with a
// public ID, runs its operations on a Backend and records their events.
// The Backend holds the pools of package reservation and runs their
// transitions, each as one atomic step: Memory in process, for one
// instance; package redispool in Redis or Redis Cluster, so that any
// instance sharing the Redis can grant, use, release or expire any
// reservation, and an instance that dies loses nothing (its reservations
// expire and return their tokens).
//
// # Pools
//
// A reservation for (client, resource) draws from the pool of the first
// rule, in policy order, that matches the client and the resource and has
// a limit of its own (tiered rules without a base limit are skipped, and
// so are rules with only a global limit, which every region shares while
// a pool is held in one region's store or instance): one
// pool per (rule, resource), whose capacity is that rule's limit, its
// Limit field, per window. A resource that no such rule matches cannot be
// reserved. The rule's reservations (policy.Reservations) set the pool's
// queue limit and the fairness quotas of its clients: their weights,
// guarantees and bursts. When a reload changes the limit or the
// reservations, the pool takes the new capacity, queue limit and quotas
// at its next Reserve; tokens already granted stay granted, and requests
// already queued keep their finish tags.
//
// # Tokens
//
// A check that carries a reservation draws its cost from the
// reservation's balance (Use). Tokens drawn stay held by the pool until
// the reservation expires, since the requests they admitted were served
// within its duration; tokens not drawn go back at Release or, at the
// latest, at expiry. The pure transitions return each token exactly once.
//
// # IDs
//
// A reservation's ID is "rsv_" + the pool's handle + "_" + 128 random
// bits: it names its pool (PoolHandle, the same on every instance)
// without naming the resource, and cannot be guessed. The numeric IDs of
// package reservation stay inside the Backend.
//
// # Time and expiry
//
// The Keeper passes its clock, Config.Now, to the Backend; when Now is nil
// it passes zero, the Backend's own clock (on Redis the server's, one clock
// for every instance). Every operation expires what is due in its pool
// first; a sweep every Config.SweepEvery expires the rest and forgets idle
// pools, so that expiries are reported (and queued requests granted) even
// when a pool sees no call. Close stops the sweep.
package reserve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/reservation"
)

// Errors of the Keeper, besides those of package reservation
// (reservation.ErrInvalid, ErrQueueFull, ErrNotFound, ErrInsufficient),
// which it returns as they are, and those of its Backend.
var (
	// ErrForbidden refuses a reservation ID presented by a client other
	// than the one that holds it.
	ErrForbidden = errors.New("sluice: reservation held by another client")
	// ErrDenyListed refuses a reservation, or a draw from one, for a
	// caller on the policy's deny list: the limits' answer (a denial)
	// stands for it.
	ErrDenyListed = errors.New("sluice: caller on the deny list")
)

// Defaults of Config.
const (
	DefaultQueueLimit  = 100
	DefaultAgingPeriod = 30 * time.Second
	DefaultSweepEvery  = time.Second
	DefaultMaxPools    = 100_000
	DefaultTimeout     = time.Second
)

// Config configures a Keeper.
type Config struct {
	// Policy returns the policy in force, from which pools take their
	// capacity. Required.
	Policy func() *policy.Policy
	// Now is the clock; nil means the Backend's own (see the package
	// documentation).
	Now func() time.Time
	// Events records grants, releases and expiries; nil records nothing.
	Events *events.Recorder
	// Backend holds the pools; nil means NewMemory(MaxPools).
	Backend Backend
	// Timeout bounds each call to the Backend; zero means DefaultTimeout.
	Timeout time.Duration
	// QueueLimit is the most requests queued per pool whose rule sets
	// none (reservations.queue_limit); zero means DefaultQueueLimit. It is
	// lowered for large pools so that capacity x queue limit stays within
	// reservation.MaxQueueTokens.
	QueueLimit int64
	// AgingPeriod is how long a queued request waits before its priority
	// rises one class; zero means DefaultAgingPeriod.
	AgingPeriod time.Duration
	// SweepEvery is the period of the expiry sweep; zero means
	// DefaultSweepEvery, negative runs no sweep (expiry then happens at
	// the pool's next call).
	SweepEvery time.Duration
	// MaxPools bounds the pools the default Memory backend holds at once
	// (each resource matching a rule may make one); zero means
	// DefaultMaxPools. A reservation that would need one more is refused
	// with reservation.ErrQueueFull until the sweep forgets idle pools.
	MaxPools int
}

// Keeper serves reservations on a Backend. It is safe for concurrent use.
// Besides the errors each method names, Reserve, Get, Release and Use
// return the Backend's failures (on Redis, errors wrapping
// sluice.ErrStoreUnavailable), and Held and Queued then answer nothing.
type Keeper struct {
	cfg Config
	be  Backend

	stop chan struct{}
	done chan struct{}
}

// New returns a Keeper for cfg and starts its sweep.
func New(cfg Config) (*Keeper, error) {
	if cfg.Policy == nil {
		return nil, errors.New("reserve: Config.Policy is required")
	}
	if cfg.QueueLimit <= 0 {
		cfg.QueueLimit = DefaultQueueLimit
	}
	cfg.QueueLimit = min(cfg.QueueLimit, reservation.MaxQueueLimit)
	if cfg.AgingPeriod <= 0 {
		cfg.AgingPeriod = DefaultAgingPeriod
	}
	if cfg.SweepEvery == 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Backend == nil {
		cfg.Backend = NewMemory(cfg.MaxPools)
	}
	k := &Keeper{
		cfg:  cfg,
		be:   cfg.Backend,
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	if cfg.SweepEvery > 0 {
		go k.sweepLoop(cfg.SweepEvery)
	} else {
		close(k.done)
	}
	return k, nil
}

// Close stops the sweep and waits for it. The Keeper still serves calls;
// closing the Backend is its owner's.
func (k *Keeper) Close() error {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	return nil
}

func (k *Keeper) sweepLoop(every time.Duration) {
	defer close(k.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
			k.Sweep()
		}
	}
}

// Sweep expires what is due in every pool, grants from their queues, and
// forgets the pools left idle. A Backend that fails is tried again at the
// next sweep; the pools' own calls expire what is due meanwhile.
func (k *Keeper) Sweep() {
	ctx, cancel := k.ctx()
	defer cancel()
	fx, _ := k.be.Sweep(ctx, k.now())
	k.emit(fx)
}

// ctx returns the context of one Backend call.
func (k *Keeper) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), k.cfg.Timeout)
}

// now returns the instant to pass to the Backend: µs since the epoch, or
// zero for the Backend's clock.
func (k *Keeper) now() int64 {
	if k.cfg.Now == nil {
		return 0
	}
	return k.cfg.Now().UnixMicro()
}

// poolFor returns the pool of (client, resource) under the policy in
// force, configured by the rule's reservations.
func (k *Keeper) poolFor(client, resource string) (*Pool, error) {
	rule, capacity := k.match(client, resource)
	if rule == nil {
		return nil, &reservation.InvalidError{Field: "resource", Reason: "no rule with a limit of its own applies to it"}
	}
	limit := k.cfg.QueueLimit
	if rs := rule.Reservations; rs != nil && rs.QueueLimit > 0 {
		limit = rs.QueueLimit
	}
	def, named := rule.Reservations.PoolQuotas(resource)
	p := &Pool{
		Handle:   PoolHandle(rule.ID, resource),
		Rule:     rule.ID,
		Resource: resource,
		Config: reservation.Config{
			Capacity:    capacity,
			QueueLimit:  max(1, min(limit, reservation.MaxQueueTokens/capacity)),
			AgingPeriod: k.cfg.AgingPeriod.Microseconds(),
			MaxDuration: reservation.MaxDuration,
			Default:     def,
			Quotas:      named,
		},
	}
	// The policy's decoder checked the quotas against the rule's limit;
	// this is the pool's own check, which a Backend relies on.
	if err := p.Config.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// match returns the rule whose limit makes the pool of (client, resource),
// and its capacity; nil when none applies.
func (k *Keeper) match(client, resource string) (*policy.Rule, int64) {
	pol := k.cfg.Policy()
	if pol == nil {
		return nil, 0
	}
	var buf [8]*policy.Rule
	for _, r := range pol.Match(&policy.Request{ClientID: client, Resource: resource}, buf[:0]) {
		l := r.LimitFor("", nil)
		if l == nil || l.Spec.DenyAll || l.Spec.Limit < 1 {
			continue
		}
		return r, min(l.Spec.Limit, reservation.MaxCapacity)
	}
	return nil, 0
}

// denied reports whether the policy in force deny-lists q.
func (k *Keeper) denied(q *policy.Request) bool {
	pol := k.cfg.Policy()
	return pol != nil && pol.Denied(q)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

const (
	idPrefix  = "rsv_"
	handleLen = 16 // hex of 8 bytes
	secretLen = 32 // hex of 16 bytes
)

// parseID splits a public ID into its pool handle and secret.
func parseID(id string) (handle, secret string, ok bool) {
	if len(id) != len(idPrefix)+handleLen+1+secretLen || id[:len(idPrefix)] != idPrefix || id[len(idPrefix)+handleLen] != '_' {
		return "", "", false
	}
	return id[len(idPrefix) : len(idPrefix)+handleLen], id[len(idPrefix)+handleLen+1:], true
}

// publicID returns the ID of the reservation secret in the pool handle.
func publicID(handle, secret string) string { return idPrefix + handle + "_" + secret }

// micros converts an instant of package reservation to a time.Time.
func micros(us int64) time.Time { return time.UnixMicro(us).UTC() }

// emit records fx as events.
func (k *Keeper) emit(fx []Effect) {
	if len(fx) == 0 || k.cfg.Events == nil {
		return
	}
	now := time.Now()
	if k.cfg.Now != nil {
		now = k.cfg.Now()
	}
	for _, e := range fx {
		k.cfg.Events.Emit(events.Event{Type: e.Type, Time: now, Severity: events.SeverityInfo, Rule: e.Rule,
			Resource: e.Resource, ClientID: e.Client, Reservation: publicID(PoolHandle(e.Rule, e.Resource), e.Secret),
			Tokens: e.Tokens})
	}
}
