package reservation

// This file holds the transitions. Each one expires what is due at now
// first, validates, changes the state, and ends by granting from the queue.
// A refused request leaves the state as the expiries left it.

// Reserve asks for a reservation at now. It returns the request's Result,
// or an *InvalidError or ErrQueueFull; see the package documentation.
func Reserve(c *Config, s *State, now int64, a Ask) (Result, Effects, error) {
	var fx Effects
	expire(s, now, &fx)
	// What was due before this request is served before it is queued.
	grant(c, s, now, &fx)
	q := c.quota(a.Client)
	if err := check(c, s, q, a); err != nil {
		return Result{}, fx, err
	}
	if s.Clients == nil {
		s.Clients = make(map[string]Client)
	}
	cl := s.Clients[a.Client]
	start := max(s.Virtual, cl.Finish)
	finish := start + ceilDiv(a.Tokens*VirtualScale, q.Weight)
	cl.Finish = finish
	cl.Queued++
	s.Clients[a.Client] = cl
	s.LastID++
	r := Request{ID: s.LastID, Client: a.Client, Tokens: a.Tokens, Duration: a.Duration,
		Priority: a.Priority, Enqueued: now, Start: start, Finish: finish}
	s.Queue = append(s.Queue, r)
	grant(c, s, now, &fx)
	for _, g := range fx.Granted {
		if g.ID == r.ID {
			return Result{ID: r.ID, Granted: true, ExpiresAt: g.ExpiresAt}, fx, nil
		}
	}
	pos, at := estimate(c, s, now, r.ID)
	return Result{ID: r.ID, Position: pos, EstimatedAt: at}, fx, nil
}

// Use draws n tokens from the balance of the granted reservation id into
// use. n must be positive and at most the balance.
func Use(c *Config, s *State, now, id, n int64) (Reservation, Effects, error) {
	var fx Effects
	expire(s, now, &fx)
	i, err := granted(s, id)
	if err != nil {
		grant(c, s, now, &fx)
		return Reservation{}, fx, err
	}
	r := &s.Granted[i]
	switch {
	case n <= 0:
		err = invalid("n", "%d not positive", n)
	case n > r.Balance:
		err = ErrInsufficient
	default:
		r.Balance -= n
		r.InUse += n
	}
	res := *r
	grant(c, s, now, &fx)
	return res, fx, err
}

// Complete ends n tokens of use of reservation id and returns them to the
// pool. n must be positive and at most the tokens in use.
func Complete(c *Config, s *State, now, id, n int64) (Reservation, Effects, error) {
	var fx Effects
	expire(s, now, &fx)
	i, err := granted(s, id)
	if err == nil {
		r := &s.Granted[i]
		switch {
		case n <= 0:
			err = invalid("n", "%d not positive", n)
		case n > r.InUse:
			err = ErrInsufficient
		default:
			r.InUse -= n
			give(s, r.Client, n)
		}
	}
	var res Reservation
	if i >= 0 {
		res = s.Granted[i]
	}
	grant(c, s, now, &fx)
	return res, fx, err
}

// Release returns the unused balance of reservation id to the pool and
// reports how many tokens it returned: the balance the first time, 0 after.
// Tokens in use stay held until completed or expired.
func Release(c *Config, s *State, now, id int64) (int64, Effects, error) {
	var fx Effects
	expire(s, now, &fx)
	i, err := granted(s, id)
	returned := int64(0)
	if err == nil {
		r := &s.Granted[i]
		returned = r.Balance
		give(s, r.Client, returned)
		r.Balance, r.Released = 0, true
	}
	grant(c, s, now, &fx)
	return returned, fx, err
}

// Cancel removes the queued request id.
func Cancel(c *Config, s *State, now, id int64) (Effects, error) {
	var fx Effects
	expire(s, now, &fx)
	var err error
	i := queued(s, id)
	switch {
	case i >= 0:
		r := s.Queue[i]
		s.Queue = append(s.Queue[:i], s.Queue[i+1:]...)
		cl := s.Clients[r.Client]
		cl.Queued--
		s.Clients[r.Client] = cl
		forget(s, r.Client)
	case grantedAt(s, id) >= 0:
		err = ErrNotQueued
	default:
		err = ErrNotFound
	}
	// A cancelled head may unblock the ones behind it.
	grant(c, s, now, &fx)
	return fx, err
}

// Expire expires the reservations due at now and grants from the queue.
func Expire(c *Config, s *State, now int64) Effects {
	var fx Effects
	expire(s, now, &fx)
	grant(c, s, now, &fx)
	return fx
}

// GrantQueued grants from the queue as far as the pool allows at now (see the
// package documentation). Every transition ends with it; it is exported
// for a store that changes the configuration (a larger capacity, new quotas) and
// wants the queue served at once.
func GrantQueued(c *Config, s *State, now int64) Effects {
	var fx Effects
	grant(c, s, now, &fx)
	return fx
}

// Estimate returns the place of the queued request id in the order at now
// (1 for the head) and the estimate of its grant instant that Reserve
// gives (see Result.EstimatedAt); 0 and now when id is not queued. It
// reads the state and changes nothing: a store answering "where is my
// request?" calls it after a transition at now.
func Estimate(c *Config, s *State, now, id int64) (position, at int64) {
	return estimate(c, s, now, id)
}

// expire removes the reservations whose ExpiresAt <= now and returns what
// they held, keeping the order of the others.
func expire(s *State, now int64, fx *Effects) {
	kept := s.Granted[:0]
	for _, r := range s.Granted {
		if r.ExpiresAt > now {
			kept = append(kept, r)
			continue
		}
		back := r.Balance + r.InUse
		give(s, r.Client, back)
		fx.Expired = append(fx.Expired, Expiry{ID: r.ID, Client: r.Client, Returned: back})
	}
	clear(s.Granted[len(kept):])
	s.Granted = kept
}

// give returns n tokens held by client to the pool.
func give(s *State, client string, n int64) {
	s.Held -= n
	cl := s.Clients[client]
	cl.Held -= n
	s.Clients[client] = cl
	forget(s, client)
}

// forget removes a client that has nothing left in the pool and whose
// finish tag is behind the virtual time: it is the same as never seen.
func forget(s *State, client string) {
	cl := s.Clients[client]
	if cl.Held == 0 && cl.Queued == 0 && cl.Finish <= s.Virtual {
		delete(s.Clients, client)
	}
}

// granted returns the index of reservation id in s.Granted, or -1 and
// ErrNotGranted or ErrNotFound.
func granted(s *State, id int64) (int, error) {
	if i := grantedAt(s, id); i >= 0 {
		return i, nil
	}
	if queued(s, id) >= 0 {
		return -1, ErrNotGranted
	}
	return -1, ErrNotFound
}

func grantedAt(s *State, id int64) int {
	for i := range s.Granted {
		if s.Granted[i].ID == id {
			return i
		}
	}
	return -1
}

func queued(s *State, id int64) int {
	for i := range s.Queue {
		if s.Queue[i].ID == id {
			return i
		}
	}
	return -1
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// check validates a request to Reserve from a client of quota q.
func check(c *Config, s *State, q Quota, a Ask) error {
	tokens, duration, p := a.Tokens, a.Duration, a.Priority
	switch {
	case a.Client == "":
		return invalid("client", "empty")
	case tokens <= 0:
		return invalid("tokens", "%d not positive", tokens)
	case tokens > c.Capacity:
		return invalid("tokens", "%d above the capacity %d", tokens, c.Capacity)
	case tokens > q.MaxBurst:
		return invalid("tokens", "%d above the client's max_burst %d", tokens, q.MaxBurst)
	case duration <= 0:
		return invalid("duration", "%dµs not positive", duration)
	case duration > c.maxDuration():
		return invalid("duration", "%dµs above %dµs", duration, c.maxDuration())
	case p != High && p != Normal && p != Low:
		return invalid("priority", "unknown priority %d", int64(p))
	case int64(len(s.Queue)) >= c.QueueLimit:
		return ErrQueueFull
	}
	return nil
}
