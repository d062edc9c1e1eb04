package reservation

import (
	"cmp"
	"slices"
)

// key is a request's place in the order at some instant: smaller first.
type key struct {
	tier int64 // 0 overdue, 1 within the guarantee, 2 + effective class
	tag  int64 // the deadline for the overdue, else the finish tag
	id   int64
}

func (a key) compare(b key) int {
	if c := cmp.Compare(a.tier, b.tier); c != 0 {
		return c
	}
	if c := cmp.Compare(a.tag, b.tag); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

// order returns the key of r at now; held is what its client holds.
func order(c *Config, r *Request, now, held int64) key {
	k := int64(r.Priority) - 1 // the class
	aged := max(now-r.Enqueued, 0) / c.AgingPeriod
	if aged > k {
		return key{tier: 0, tag: r.Enqueued + (k+1)*c.AgingPeriod, id: r.ID}
	}
	if held+r.Tokens <= c.quota(r.Client).MinGuaranteed {
		return key{tier: 1, tag: r.Finish, id: r.ID}
	}
	return key{tier: 2 + k - aged, tag: r.Finish, id: r.ID}
}

// grant grants from the queue at now: the first eligible request of the
// order while it fits in the free tokens.
func grant(c *Config, s *State, now int64, fx *Effects) {
	for {
		best, bk := -1, key{}
		for i := range s.Queue {
			r := &s.Queue[i]
			held := s.Clients[r.Client].Held
			if held+r.Tokens > c.quota(r.Client).MaxBurst {
				continue // at its burst: skipped, not blocking
			}
			if k := order(c, r, now, held); best < 0 || k.compare(bk) < 0 {
				best, bk = i, k
			}
		}
		if best < 0 || s.Queue[best].Tokens > c.Capacity-s.Held {
			if s.Held == 0 && len(s.Queue) == 0 && len(s.Granted) == 0 {
				// An idle pool: the fair queue's history no longer
				// matters, and the zero state is the same pool.
				s.Virtual = 0
				clear(s.Clients)
			}
			return
		}
		r := s.Queue[best]
		s.Queue = append(s.Queue[:best], s.Queue[best+1:]...)
		cl := s.Clients[r.Client]
		cl.Held += r.Tokens
		cl.Queued--
		s.Clients[r.Client] = cl
		s.Held += r.Tokens
		s.Virtual = max(s.Virtual, r.Start)
		exp := now + r.Duration
		s.Granted = append(s.Granted, Reservation{ID: r.ID, Client: r.Client, Tokens: r.Tokens,
			Balance: r.Tokens, GrantedAt: now, ExpiresAt: exp})
		fx.Granted = append(fx.Granted, Grant{ID: r.ID, Client: r.Client, Tokens: r.Tokens, ExpiresAt: exp})
		if s.Virtual >= rebaseAt {
			rebase(s)
		}
	}
}

// rebase shifts every tag down by the virtual time, which keeps their
// order and the differences the fair queue works with.
func rebase(s *State) {
	v := s.Virtual
	s.Virtual = 0
	for name, cl := range s.Clients {
		cl.Finish -= v
		s.Clients[name] = cl
	}
	for i := range s.Queue {
		s.Queue[i].Start -= v
		s.Queue[i].Finish -= v
	}
}

// estimate returns the position of the queued request id in the order at
// now (1 for the head) and an estimate of its grant instant: the queue
// served in order, each reservation held to its expiry, each request
// ahead granted as soon as tokens are back and held for its duration.
// It leaves out the clients' bursts and guarantees as they change.
func estimate(c *Config, s *State, now, id int64) (int64, int64) {
	type item struct {
		k key
		r *Request
	}
	items := make([]item, len(s.Queue))
	for i := range s.Queue {
		r := &s.Queue[i]
		items[i] = item{order(c, r, now, s.Clients[r.Client].Held), r}
	}
	slices.SortFunc(items, func(a, b item) int { return a.k.compare(b.k) })
	// Tokens coming back, by instant.
	type back struct{ at, n int64 }
	byAt := func(a, b back) int { return cmp.Compare(a.at, b.at) }
	var backs []back
	for _, g := range s.Granted {
		if n := g.Balance + g.InUse; n > 0 {
			backs = append(backs, back{g.ExpiresAt, n})
		}
	}
	slices.SortFunc(backs, byAt)
	free, t := c.Capacity-s.Held, now
	for pos, it := range items {
		for free < it.r.Tokens && len(backs) > 0 {
			free += backs[0].n
			t = max(t, backs[0].at)
			backs = backs[1:]
		}
		if it.r.ID == id {
			return int64(pos + 1), t
		}
		free -= it.r.Tokens
		b := back{t + it.r.Duration, it.r.Tokens}
		i, _ := slices.BinarySearchFunc(backs, b, byAt)
		backs = slices.Insert(backs, i, b)
	}
	return 0, now
}
