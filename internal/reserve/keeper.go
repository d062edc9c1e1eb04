// Package reserve serves reservations of capacity on one instance: a Keeper
// holds, in process, the pools of package reservation and runs their
// transitions, each pool behind its own mutex, at the Keeper's clock.
//
// # Pools
//
// A reservation for (client, resource) draws from the pool of the first
// rule, in policy order, that matches the client and the resource and has
// a limit of its own (tiered rules without a base limit are skipped, and
// so are rules with only a global limit, which every region shares while
// a pool is held by one instance): one
// pool per (rule, resource), whose capacity is that rule's limit, its
// Limit field, per window. A resource that no such rule matches cannot be
// reserved. When a reload changes the limit, the pool takes the new
// capacity at its next transition; tokens already granted stay granted.
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
// bits: it names its pool without naming the resource, and cannot be
// guessed. The numeric IDs of package reservation stay inside the Keeper.
//
// # Expiry
//
// Every transition expires what is due first; a sweep every
// Config.SweepEvery expires the rest and forgets idle pools, so that
// expiries are reported (and queued requests granted) even when a pool
// sees no call. Close stops the sweep.
package reserve

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/reservation"
)

// Errors of the Keeper, besides those of package reservation
// (reservation.ErrInvalid, ErrQueueFull, ErrNotFound, ErrInsufficient),
// which it returns as they are.
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
)

// Config configures a Keeper.
type Config struct {
	// Policy returns the policy in force, from which pools take their
	// capacity. Required.
	Policy func() *policy.Policy
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Events records grants, releases and expiries; nil records nothing.
	Events *events.Recorder
	// QueueLimit is the most requests queued per pool; zero means
	// DefaultQueueLimit. It is lowered for large pools so that capacity x
	// queue limit stays within reservation.MaxQueueTokens.
	QueueLimit int64
	// AgingPeriod is how long a queued request waits before its priority
	// rises one class; zero means DefaultAgingPeriod.
	AgingPeriod time.Duration
	// SweepEvery is the period of the expiry sweep; zero means
	// DefaultSweepEvery, negative runs no sweep (expiry then happens at
	// the pool's next call).
	SweepEvery time.Duration
	// MaxPools bounds the pools held at once (each resource matching a
	// rule may make one); zero means DefaultMaxPools. A reservation that
	// would need one more is refused with reservation.ErrQueueFull until
	// the sweep forgets idle pools.
	MaxPools int
}

// Keeper holds the pools of one instance. It is safe for concurrent use.
type Keeper struct {
	cfg Config

	mu       sync.Mutex
	pools    map[poolKey]*pool // guarded by mu
	byHandle map[string]*pool  // guarded by mu

	stop chan struct{}
	done chan struct{}
}

type poolKey struct{ rule, resource string }

// pool is one pool and the IDs of its reservations. Lock order: Keeper.mu
// before pool.mu; transitions take pool.mu alone.
type pool struct {
	handle, rule, resource string

	mu     sync.Mutex
	dead   bool // removed from the Keeper by the sweep: look it up again
	conf   reservation.Config
	st     reservation.State
	byID   map[int64]*entry
	bySecr map[string]int64
}

// entry is what the Keeper knows of a reservation besides its state.
type entry struct {
	id       string // the public ID
	secret   string
	client   string
	released bool
}

// New returns a Keeper for cfg and starts its sweep.
func New(cfg Config) (*Keeper, error) {
	if cfg.Policy == nil {
		return nil, errors.New("reserve: Config.Policy is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
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
	if cfg.MaxPools <= 0 {
		cfg.MaxPools = DefaultMaxPools
	}
	k := &Keeper{
		cfg:      cfg,
		pools:    make(map[poolKey]*pool),
		byHandle: make(map[string]*pool),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if cfg.SweepEvery > 0 {
		go k.sweepLoop(cfg.SweepEvery)
	} else {
		close(k.done)
	}
	return k, nil
}

// Close stops the sweep and waits for it. The Keeper still serves calls.
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
// forgets the pools left idle.
func (k *Keeper) Sweep() {
	k.mu.Lock()
	pools := make([]*pool, 0, len(k.pools))
	for _, p := range k.pools {
		pools = append(pools, p)
	}
	k.mu.Unlock()
	now := k.cfg.Now()
	for _, p := range pools {
		p.mu.Lock()
		fx := reservation.Expire(&p.conf, &p.st, now.UnixMicro())
		evs := p.effects(fx, now)
		p.mu.Unlock()
		k.emit(evs)
	}
	// Forget the idle pools: nothing granted, nothing queued.
	k.mu.Lock()
	for key, p := range k.pools {
		p.mu.Lock()
		if len(p.st.Granted) == 0 && len(p.st.Queue) == 0 {
			p.dead = true
			delete(k.pools, key)
			delete(k.byHandle, p.handle)
		}
		p.mu.Unlock()
	}
	k.mu.Unlock()
}

// poolFor returns the pool of (client, resource) under the policy in
// force, creating it, locked; the caller unlocks it.
func (k *Keeper) poolFor(client, resource string) (*pool, error) {
	rule, capacity := k.match(client, resource)
	if rule == "" {
		return nil, &reservation.InvalidError{Field: "resource", Reason: "no rule with a limit of its own applies to it"}
	}
	key := poolKey{rule, resource}
	for {
		k.mu.Lock()
		p := k.pools[key]
		if p == nil && len(k.pools) >= k.cfg.MaxPools {
			k.mu.Unlock()
			return nil, fmt.Errorf("%w: %d pools held, the most this instance keeps", reservation.ErrQueueFull, len(k.pools))
		}
		if p == nil {
			p = &pool{
				handle:   newHandle(k.byHandle),
				rule:     rule,
				resource: resource,
				byID:     make(map[int64]*entry),
				bySecr:   make(map[string]int64),
			}
			k.pools[key] = p
			k.byHandle[p.handle] = p
		}
		k.mu.Unlock()
		p.mu.Lock()
		if p.dead {
			p.mu.Unlock()
			continue
		}
		k.configure(p, capacity)
		return p, nil
	}
}

// configure sets p's configuration for capacity; requires p.mu held.
func (k *Keeper) configure(p *pool, capacity int64) {
	if p.conf.Capacity == capacity {
		return
	}
	p.conf = reservation.Config{
		Capacity:    capacity,
		QueueLimit:  max(1, min(k.cfg.QueueLimit, reservation.MaxQueueTokens/capacity)),
		AgingPeriod: k.cfg.AgingPeriod.Microseconds(),
		MaxDuration: reservation.MaxDuration,
	}
}

// match returns the rule whose limit makes the pool of (client, resource),
// and its capacity; "" when none applies.
func (k *Keeper) match(client, resource string) (string, int64) {
	pol := k.cfg.Policy()
	if pol == nil {
		return "", 0
	}
	var buf [8]*policy.Rule
	for _, r := range pol.Match(&policy.Request{ClientID: client, Resource: resource}, buf[:0]) {
		l := r.LimitFor("", nil)
		if l == nil || l.Spec.DenyAll || l.Spec.Limit < 1 {
			continue
		}
		return r.ID, min(l.Spec.Limit, reservation.MaxCapacity)
	}
	return "", 0
}

// denied reports whether the policy in force deny-lists q.
func (k *Keeper) denied(q *policy.Request) bool {
	pol := k.cfg.Policy()
	return pol != nil && pol.Denied(q)
}

// lookup returns the pool and the reservation of the public ID, the pool
// locked; the caller unlocks it. It refuses an ID held by another client
// than client (unless client is empty) with ErrForbidden.
func (k *Keeper) lookup(client, id string) (*pool, int64, *entry, error) {
	handle, secret, ok := parseID(id)
	if !ok {
		return nil, 0, nil, reservation.ErrNotFound
	}
	k.mu.Lock()
	p := k.byHandle[handle]
	k.mu.Unlock()
	if p == nil {
		return nil, 0, nil, reservation.ErrNotFound
	}
	p.mu.Lock()
	n, ok := p.bySecr[secret]
	if p.dead || !ok {
		p.mu.Unlock()
		return nil, 0, nil, reservation.ErrNotFound
	}
	e := p.byID[n]
	if client != "" && client != e.client {
		p.mu.Unlock()
		return nil, 0, nil, ErrForbidden
	}
	return p, n, e, nil
}

// newHandle returns a random pool handle not in taken.
func newHandle(taken map[string]*pool) string {
	for {
		h := randomHex(8)
		if _, ok := taken[h]; !ok {
			return h
		}
	}
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

// micros converts an instant of package reservation to a time.Time.
func micros(us int64) time.Time { return time.UnixMicro(us).UTC() }

// effects applies fx to p's IDs and returns the events to emit once p.mu
// is released; requires p.mu held.
func (p *pool) effects(fx reservation.Effects, now time.Time) []events.Event {
	var evs []events.Event
	for _, x := range fx.Expired {
		e := p.byID[x.ID]
		delete(p.byID, x.ID)
		if e == nil {
			continue
		}
		delete(p.bySecr, e.secret)
		evs = append(evs, p.event(events.ReservationExpired, now, e, x.Returned))
	}
	for _, g := range fx.Granted {
		if e := p.byID[g.ID]; e != nil {
			evs = append(evs, p.event(events.ReservationGranted, now, e, g.Tokens))
		}
	}
	return evs
}

func (p *pool) event(t events.Type, now time.Time, e *entry, tokens int64) events.Event {
	return events.Event{Type: t, Time: now, Severity: events.SeverityInfo, Rule: p.rule,
		Resource: p.resource, ClientID: e.client, Reservation: e.id, Tokens: tokens}
}

func (k *Keeper) emit(evs []events.Event) {
	for _, ev := range evs {
		k.cfg.Events.Emit(ev)
	}
}
