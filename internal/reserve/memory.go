package reserve

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/reservation"
)

// Memory is the Backend of one instance: the pools in process, each
// behind its own mutex, the transitions run on them as they are. Create
// it with NewMemory; it is safe for concurrent use.
type Memory struct {
	maxPools int

	mu    sync.Mutex
	pools map[string]*pool // by handle; guarded by mu
}

// NewMemory returns an empty Memory holding at most maxPools pools at once
// (zero means DefaultMaxPools): a reservation that would need one more is
// refused with reservation.ErrQueueFull until Sweep forgets idle pools.
func NewMemory(maxPools int) *Memory {
	if maxPools <= 0 {
		maxPools = DefaultMaxPools
	}
	return &Memory{maxPools: maxPools, pools: make(map[string]*pool)}
}

// pool is one pool and the IDs of its reservations. Lock order: Memory.mu
// before pool.mu; transitions take pool.mu alone.
type pool struct {
	rule, resource string

	mu     sync.Mutex
	dead   bool // removed by the sweep: look it up again
	conf   reservation.Config
	st     reservation.State
	byID   map[int64]*entry
	bySecr map[string]int64
}

// entry is what the pool knows of a reservation besides its state.
type entry struct {
	secret   string
	client   string
	released bool
}

// timeOf returns now, or the time of day for a zero now.
func timeOf(now int64) int64 {
	if now == 0 {
		return time.Now().UnixMicro()
	}
	return now
}

// Reserve implements Backend.
func (m *Memory) Reserve(_ context.Context, pp *Pool, now int64, a reservation.Ask, secret string) (reservation.Result, []Effect, error) {
	p, err := m.poolFor(pp)
	if err != nil {
		return reservation.Result{}, nil, err
	}
	defer p.mu.Unlock()
	now = timeOf(now)
	res, fx, err := reservation.Reserve(&p.conf, &p.st, now, a)
	if err == nil {
		p.byID[res.ID] = &entry{secret: secret, client: a.Client}
		p.bySecr[secret] = res.ID
	}
	return res, p.effects(fx, nil), err
}

// poolFor returns the pool pp, created or configured as pp says, locked;
// the caller unlocks it.
func (m *Memory) poolFor(pp *Pool) (*pool, error) {
	for {
		m.mu.Lock()
		p := m.pools[pp.Handle]
		if p == nil && len(m.pools) >= m.maxPools {
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: %d pools held, the most this instance keeps", reservation.ErrQueueFull, m.maxPools)
		}
		if p == nil {
			p = &pool{rule: pp.Rule, resource: pp.Resource, byID: make(map[int64]*entry), bySecr: make(map[string]int64)}
			m.pools[pp.Handle] = p
		}
		m.mu.Unlock()
		p.mu.Lock()
		if p.dead {
			p.mu.Unlock()
			continue
		}
		p.conf = pp.Config // the policy in force: capacity, queue limit, quotas
		return p, nil
	}
}

// lookup returns the pool of handle and the reservation of secret, the
// pool locked; the caller unlocks it. See Backend for the refusals.
func (m *Memory) lookup(handle, secret, client string) (*pool, int64, *entry, error) {
	m.mu.Lock()
	p := m.pools[handle]
	m.mu.Unlock()
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
	var err error
	switch {
	case client != "" && client != e.client:
		err = ErrForbidden
	case e.released:
		err = reservation.ErrNotFound
	default:
		return p, n, e, nil
	}
	p.mu.Unlock()
	return nil, 0, nil, err
}

// Get implements Backend.
func (m *Memory) Get(_ context.Context, handle, secret, client string, now int64) (Record, []Effect, error) {
	p, n, e, err := m.lookup(handle, secret, client)
	if err != nil {
		return Record{}, nil, err
	}
	defer p.mu.Unlock()
	now = timeOf(now)
	fx := p.effects(reservation.Expire(&p.conf, &p.st, now), nil)
	rec, err := p.record(n, e)
	if err == nil && rec.Queued {
		rec.Position, rec.EstimatedAt = reservation.Estimate(&p.conf, &p.st, now, n)
	}
	return rec, fx, err
}

// Use implements Backend.
func (m *Memory) Use(_ context.Context, handle, secret, client string, now, n int64) (Record, []Effect, error) {
	p, num, e, err := m.lookup(handle, secret, client)
	if err != nil {
		return Record{}, nil, err
	}
	defer p.mu.Unlock()
	now = timeOf(now)
	var fx reservation.Effects
	if n == 0 {
		fx = reservation.Expire(&p.conf, &p.st, now)
	} else {
		_, fx, err = reservation.Use(&p.conf, &p.st, now, num, n)
	}
	effects := p.effects(fx, nil)
	var rec Record
	if err == nil {
		rec, err = p.record(num, e)
		if err == nil && rec.Queued {
			rec, err = Record{}, reservation.ErrNotGranted
		}
	}
	return rec, effects, err
}

// Release implements Backend.
func (m *Memory) Release(_ context.Context, handle, secret, client string, now int64) (Ended, []Effect, error) {
	p, n, e, err := m.lookup(handle, secret, client)
	if err != nil {
		return Ended{}, nil, err
	}
	defer p.mu.Unlock()
	now = timeOf(now)
	var end Ended
	fx, err := reservation.Cancel(&p.conf, &p.st, now, n)
	if err == nil {
		end.State = "cancelled"
		delete(p.byID, n)
		delete(p.bySecr, e.secret)
		return end, p.effects(fx, nil), nil
	}
	if err != reservation.ErrNotQueued {
		return end, p.effects(fx, nil), err
	}
	effects := p.effects(fx, nil)
	end.State = "released"
	end.Returned, fx, err = reservation.Release(&p.conf, &p.st, now, n)
	if err == nil {
		// The record stays until expiry, when what was used returns.
		e.released = true
		effects = append(effects, p.effect(events.ReservationReleased, e, end.Returned, 0))
	}
	effects = p.effects(fx, effects)
	if err != nil {
		return Ended{}, effects, err
	}
	return end, effects, nil
}

// Sweep implements Backend.
func (m *Memory) Sweep(_ context.Context, now int64) ([]Effect, error) {
	m.mu.Lock()
	pools := make([]*pool, 0, len(m.pools))
	for _, p := range m.pools {
		pools = append(pools, p)
	}
	m.mu.Unlock()
	now = timeOf(now)
	var effects []Effect
	for _, p := range pools {
		p.mu.Lock()
		effects = p.effects(reservation.Expire(&p.conf, &p.st, now), effects)
		p.mu.Unlock()
	}
	// Forget the idle pools: nothing granted, nothing queued.
	m.mu.Lock()
	for h, p := range m.pools {
		p.mu.Lock()
		if len(p.st.Granted) == 0 && len(p.st.Queue) == 0 {
			p.dead = true
			delete(m.pools, h)
		}
		p.mu.Unlock()
	}
	m.mu.Unlock()
	return effects, nil
}

// Peek implements Backend.
func (m *Memory) Peek(_ context.Context, handle, client string, now int64) (Peeked, error) {
	m.mu.Lock()
	p := m.pools[handle]
	m.mu.Unlock()
	if p == nil {
		return Peeked{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pk := Peeked{Held: p.st.Held, Capacity: p.conf.Capacity}
	if client == "" {
		return pk, nil
	}
	now = timeOf(now)
	for _, q := range p.st.Queue {
		if q.Client == client {
			pk.Position, pk.EstimatedAt = reservation.Estimate(&p.conf, &p.st, now, q.ID)
			break
		}
	}
	return pk, nil
}

// record returns the record of reservation n; requires p.mu held.
func (p *pool) record(n int64, e *entry) (Record, error) {
	if e.released || p.byID[n] == nil {
		return Record{}, reservation.ErrNotFound
	}
	rec := Record{Client: e.client, Rule: p.rule, Resource: p.resource}
	for _, q := range p.st.Queue {
		if q.ID == n {
			rec.Queued, rec.Tokens = true, q.Tokens
			return rec, nil
		}
	}
	for _, g := range p.st.Granted {
		if g.ID == n {
			rec.Tokens, rec.Balance, rec.InUse = g.Tokens, g.Balance, g.InUse
			rec.GrantedAt, rec.ExpiresAt = g.GrantedAt, g.ExpiresAt
			return rec, nil
		}
	}
	return Record{}, reservation.ErrNotFound
}

// effects applies fx to p's IDs and appends them to out; requires p.mu
// held.
func (p *pool) effects(fx reservation.Effects, out []Effect) []Effect {
	for _, x := range fx.Expired {
		e := p.byID[x.ID]
		delete(p.byID, x.ID)
		if e == nil {
			continue
		}
		delete(p.bySecr, e.secret)
		out = append(out, p.effect(events.ReservationExpired, e, x.Returned, 0))
	}
	for _, g := range fx.Granted {
		if e := p.byID[g.ID]; e != nil {
			out = append(out, p.effect(events.ReservationGranted, e, g.Tokens, g.ExpiresAt))
		}
	}
	return out
}

func (p *pool) effect(t events.Type, e *entry, tokens, expires int64) Effect {
	return Effect{Type: t, Secret: e.secret, Client: e.client, Rule: p.rule, Resource: p.resource,
		Tokens: tokens, ExpiresAt: expires}
}
