package reserve

import (
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/reservation"
)

// Ask is a request for a reservation.
type Ask struct {
	// Client and Resource say who reserves, and from which pool.
	Client, Resource string
	// Tokens is the number of tokens asked for.
	Tokens int64
	// Duration is how long the reservation lasts once granted: positive,
	// at most 300 s, in whole microseconds.
	Duration time.Duration
	// Priority is reservation.High, Normal or Low.
	Priority reservation.Priority
}

// Result is the outcome of Reserve.
type Result struct {
	// ID identifies the reservation.
	ID string
	// Granted reports that the tokens were granted at once; else the
	// request is queued.
	Granted bool
	// Tokens is the number of tokens asked for (and granted, when
	// Granted).
	Tokens int64
	// ExpiresAt is when a granted reservation expires.
	ExpiresAt time.Time
	// Position is 0 when granted, else the request's place in the queue,
	// 1 for the head; EstimatedAt is then an upper estimate of its grant
	// (see reservation.Result).
	Position    int64
	EstimatedAt time.Time
}

// Reserve asks for a reservation. Its errors are those of
// reservation.Reserve: an *reservation.InvalidError naming the field
// ("resource" when no rule gives the resource a pool), or
// reservation.ErrQueueFull.
func (k *Keeper) Reserve(a Ask) (Result, error) {
	if a.Duration <= 0 || a.Duration%time.Microsecond != 0 {
		return Result{}, &reservation.InvalidError{Field: "duration", Reason: "not a positive number of microseconds"}
	}
	if a.Client == "" {
		return Result{}, &reservation.InvalidError{Field: "client", Reason: "empty"}
	}
	if k.denied(&policy.Request{ClientID: a.Client, Resource: a.Resource}) {
		return Result{}, ErrDenyListed
	}
	p, err := k.poolFor(a.Client, a.Resource)
	if err != nil {
		return Result{}, err
	}
	now := k.cfg.Now()
	res, fx, err := reservation.Reserve(&p.conf, &p.st, now.UnixMicro(), reservation.Ask{
		Client: a.Client, Tokens: a.Tokens, Duration: a.Duration.Microseconds(), Priority: a.Priority,
	})
	var out Result
	if err == nil {
		secret := randomHex(16)
		e := &entry{id: idPrefix + p.handle + "_" + secret, secret: secret, client: a.Client}
		p.byID[res.ID] = e
		p.bySecr[secret] = res.ID
		out = Result{ID: e.id, Granted: res.Granted, Tokens: a.Tokens, Position: res.Position}
		if res.Granted {
			out.ExpiresAt = micros(res.ExpiresAt)
		} else {
			out.EstimatedAt = micros(res.EstimatedAt)
		}
	}
	evs := p.effects(fx, now)
	p.mu.Unlock()
	k.emit(evs)
	return out, err
}

// Status is the state of a reservation.
type Status struct {
	ID, Client, Resource string
	// Rule is the rule whose limit makes the pool.
	Rule string
	// State is "queued" or "granted".
	State string
	// Tokens is the number asked for (and granted).
	Tokens int64
	// Balance is what is left to use; Used what checks drew from it.
	// Both are 0 while queued.
	Balance, Used int64
	// GrantedAt and ExpiresAt are set once granted.
	GrantedAt, ExpiresAt time.Time
	// Position and EstimatedAt are, while queued, the request's place in
	// the queue (1 for the head) and an upper estimate of its grant.
	Position    int64
	EstimatedAt time.Time
}

// Get returns the state of reservation id. client, when not empty, must be
// the holder's (else ErrForbidden). An unknown, expired or released ID is
// reservation.ErrNotFound.
func (k *Keeper) Get(client, id string) (Status, error) {
	p, n, e, err := k.lookup(client, id)
	if err != nil {
		return Status{}, err
	}
	now := k.cfg.Now()
	fx := reservation.Expire(&p.conf, &p.st, now.UnixMicro())
	evs := p.effects(fx, now)
	st, err := p.status(n, e)
	if err == nil && st.State == "queued" {
		pos, at := reservation.Estimate(&p.conf, &p.st, now.UnixMicro(), n)
		st.Position, st.EstimatedAt = pos, micros(at)
	}
	p.mu.Unlock()
	k.emit(evs)
	return st, err
}

// status returns the state of reservation n; requires p.mu held.
func (p *pool) status(n int64, e *entry) (Status, error) {
	if e.released || p.byID[n] == nil {
		return Status{}, reservation.ErrNotFound
	}
	st := Status{ID: e.id, Client: e.client, Resource: p.resource, Rule: p.rule}
	for _, q := range p.st.Queue {
		if q.ID == n {
			st.State, st.Tokens = "queued", q.Tokens
			return st, nil
		}
	}
	for _, g := range p.st.Granted {
		if g.ID == n {
			st.State, st.Tokens, st.Balance, st.Used = "granted", g.Tokens, g.Balance, g.InUse
			st.GrantedAt, st.ExpiresAt = micros(g.GrantedAt), micros(g.ExpiresAt)
			return st, nil
		}
	}
	return Status{}, reservation.ErrNotFound
}

// Ended says how Release ended a reservation.
type Ended struct {
	// State is "released" (it was granted) or "cancelled" (it was
	// queued).
	State string
	// Returned is the number of tokens given back to the pool: the
	// balance not used. Tokens used stay held until expiry.
	Returned int64
}

// Release ends reservation id: a granted one is released, its balance
// returned to the pool; a queued one is cancelled. A second Release, like
// any later call with the ID, is reservation.ErrNotFound, so tokens are
// returned once. client, when not empty, must be the holder's.
func (k *Keeper) Release(client, id string) (Ended, error) {
	p, n, e, err := k.lookup(client, id)
	if err != nil {
		return Ended{}, err
	}
	if e.released {
		p.mu.Unlock()
		return Ended{}, reservation.ErrNotFound
	}
	now := k.cfg.Now()
	var end Ended
	var evs []events.Event
	fx, err := reservation.Cancel(&p.conf, &p.st, now.UnixMicro(), n)
	switch err {
	case nil:
		end.State = "cancelled"
		delete(p.byID, n)
		delete(p.bySecr, e.secret)
	case reservation.ErrNotQueued:
		evs = p.effects(fx, now)
		end.State = "released"
		end.Returned, fx, err = reservation.Release(&p.conf, &p.st, now.UnixMicro(), n)
		if err == nil {
			// The record stays until expiry, when what was used returns.
			e.released = true
			evs = append(evs, p.event(events.ReservationReleased, now, e, end.Returned))
		}
	}
	evs = append(evs, p.effects(fx, now)...)
	p.mu.Unlock()
	k.emit(evs)
	if err != nil {
		return Ended{}, err
	}
	return end, nil
}

// Use draws n tokens from reservation id for a check of caller q (its
// ClientID must be the holder's), and
// returns the reservation's state after the draw. It is
// reservation.ErrInsufficient when the balance is short (nothing is
// drawn), reservation.ErrNotGranted while queued, reservation.ErrNotFound
// when the ID is unknown, expired or released, and ErrForbidden when
// another client holds it, ErrDenyListed when the policy deny-lists q
// (by any of its identities). n = 0 draws nothing.
func (k *Keeper) Use(q *policy.Request, id string, n int64) (Status, error) {
	if k.denied(q) {
		return Status{}, ErrDenyListed
	}
	p, num, e, err := k.lookup(q.ClientID, id)
	if err != nil {
		return Status{}, err
	}
	if e.released {
		p.mu.Unlock()
		return Status{}, reservation.ErrNotFound
	}
	now := k.cfg.Now()
	var fx reservation.Effects
	if n == 0 {
		fx = reservation.Expire(&p.conf, &p.st, now.UnixMicro())
	} else {
		_, fx, err = reservation.Use(&p.conf, &p.st, now.UnixMicro(), num, n)
	}
	evs := p.effects(fx, now)
	var st Status
	if err == nil {
		st, err = p.status(num, e)
		if err == nil && st.State == "queued" {
			err = reservation.ErrNotGranted
		}
	}
	p.mu.Unlock()
	k.emit(evs)
	if err != nil {
		return Status{}, err
	}
	return st, nil
}

// Held returns the tokens held in the pool of (client, resource), and its
// capacity; 0, 0 when it has no pool. For tests and operators.
func (k *Keeper) Held(client, resource string) (held, capacity int64) {
	rule, _ := k.match(client, resource)
	k.mu.Lock()
	p := k.pools[poolKey{rule, resource}]
	k.mu.Unlock()
	if p == nil {
		return 0, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.Held, p.conf.Capacity
}

// Queued returns the place in its pool's queue of client's first request
// queued for resource, and the estimated instant of its grant; ok is false
// when client has none queued there. A check refused by the limits tells
// its client this, so that it waits its turn rather than retrying.
func (k *Keeper) Queued(client, resource string) (position int64, at time.Time, ok bool) {
	rule, _ := k.match(client, resource)
	if rule == "" {
		return 0, time.Time{}, false
	}
	k.mu.Lock()
	p := k.pools[poolKey{rule, resource}]
	k.mu.Unlock()
	if p == nil {
		return 0, time.Time{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := k.cfg.Now().UnixMicro()
	for _, q := range p.st.Queue {
		if q.Client == client {
			pos, est := reservation.Estimate(&p.conf, &p.st, now, q.ID)
			return pos, micros(est), true
		}
	}
	return 0, time.Time{}, false
}
