package reservation

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// ledger follows every reservation from outside the package: what was
// granted and what came back, through each transition's results.
type ledger struct {
	granted  map[int64]int64 // tokens granted, by ID
	returned map[int64]int64 // tokens returned, by ID
	released map[int64]bool
	// bound is, for each queued request whose client has no burst of its
	// own, the instant by which it must be granted.
	bound map[int64]int64
	now   int64
	// checked counts the grants checked against the bound; closest is
	// the largest fraction of its bound a wait took.
	checked int
	closest float64
	wait    map[int64]int64 // the bound's length, by ID
}

func (l *ledger) effects(t *testing.T, fx Effects) {
	t.Helper()
	for _, g := range fx.Granted {
		if _, dup := l.granted[g.ID]; dup {
			t.Fatalf("reservation %d granted twice", g.ID)
		}
		l.granted[g.ID] = g.Tokens
		if b, ok := l.bound[g.ID]; ok {
			if l.now > b {
				t.Fatalf("reservation %d granted %dµs after its bound", g.ID, l.now-b)
			}
			l.checked++
			w := l.wait[g.ID]
			l.closest = max(l.closest, float64(w-(b-l.now))/float64(w))
		}
		delete(l.bound, g.ID)
	}
	for _, e := range fx.Expired {
		l.returned[e.ID] += e.Returned
	}
}

// TestConservation runs random sequences of every transition on small
// pools and checks at every step that the tokens granted and the tokens
// free make the capacity, that the queue's head never fits (the pool
// grants as far as it can), that every request (of a client without a
// burst of its own) is granted within the aging bound, and at the end,
// once everything has expired, that every token granted came back exactly
// once.
func TestConservation(t *testing.T) {
	checked, closest := 0, 0.0
	defer func() {
		t.Logf("%d grants checked against the aging bound, the longest wait %.1f%% of its bound", checked, 100*closest)
	}()
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := &Config{
			Capacity:    1 + rng.Int64N(20),
			QueueLimit:  1 + rng.Int64N(8),
			AgingPeriod: 1 + rng.Int64N(5*sec),
			MaxDuration: 1 + rng.Int64N(10*sec),
			Quotas:      map[string]Quota{},
		}
		clients := []string{"a", "b", "c", "d"}
		for _, name := range clients[:2] {
			burst := 1 + rng.Int64N(c.Capacity)
			c.Quotas[name] = Quota{Weight: 1 + rng.Int64N(4), MaxBurst: burst, MinGuaranteed: rng.Int64N(min(burst, c.Capacity/2) + 1)}
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		var s State
		l := ledger{granted: map[int64]int64{}, returned: map[int64]int64{}, released: map[int64]bool{}, bound: map[int64]int64{}, wait: map[int64]int64{}}
		// The aging bound, with the lag of expiries that happen only when
		// a transition runs, at most gap after they are due.
		const gap = sec
		wait := func(p Priority) int64 {
			return int64(p)*c.AgingPeriod + c.QueueLimit*(c.maxDuration()+gap) + gap
		}
		now := t0
		pick := func() int64 { return 1 + rng.Int64N(s.LastID+2) } // known, or not
		for step := 0; step < 400; step++ {
			now += rng.Int64N(gap)
			l.now = now
			var fx Effects
			var err error
			switch rng.IntN(7) {
			case 0, 1:
				tokens := rng.Int64N(c.Capacity+2) - 1
				dur := rng.Int64N(c.maxDuration()+2) - 1
				p := Priority(1 + rng.IntN(4)) // 1 in 4 invalid
				var r Result
				client := clients[rng.IntN(len(clients))]
				r, fx, err = Reserve(c, &s, now, Ask{Client: client, Tokens: tokens, Duration: dur, Priority: p})
				if err == nil && r.Granted != (r.Position == 0) {
					t.Fatalf("seed %d step %d: result %+v", seed, step, r)
				}
				if err == nil && !r.Granted && c.quota(client).MaxBurst == c.Capacity {
					l.bound[r.ID] = now + wait(p)
					l.wait[r.ID] = wait(p)
				}
			case 2:
				_, fx, err = Use(c, &s, now, pick(), rng.Int64N(c.Capacity+1))
			case 3:
				id, n := pick(), rng.Int64N(c.Capacity+1)
				_, fx, err = Complete(c, &s, now, id, n)
				if err == nil {
					l.returned[id] += n
				}
			case 4:
				id := pick()
				var n int64
				n, fx, err = Release(c, &s, now, id)
				if err == nil {
					if l.released[id] && n != 0 {
						t.Fatalf("seed %d step %d: second release of %d returned %d", seed, step, id, n)
					}
					l.released[id] = true
					l.returned[id] += n
				}
			case 5:
				id := pick()
				fx, err = Cancel(c, &s, now, id)
				if err == nil {
					delete(l.bound, id)
				}
			case 6:
				fx = Expire(c, &s, now)
			}
			if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrQueueFull) && !errors.Is(err, ErrNotFound) &&
				!errors.Is(err, ErrInsufficient) && !errors.Is(err, ErrNotQueued) && !errors.Is(err, ErrNotGranted) {
				t.Fatalf("seed %d step %d: unexpected error %v", seed, step, err)
			}
			l.effects(t, fx)
			checkInvariant(t, c, &s)
			if more := GrantQueued(c, &s, now); len(more.Granted) > 0 {
				t.Fatalf("seed %d step %d: the queue could still grant %+v", seed, step, more.Granted)
			}
			if int64(len(s.Queue)) > c.QueueLimit {
				t.Fatalf("seed %d step %d: %d queued, limit %d", seed, step, len(s.Queue), c.QueueLimit)
			}
			// Outstanding = granted - returned, reservation by reservation.
			out := int64(0)
			for id, g := range l.granted {
				out += g - l.returned[id]
			}
			if out != s.Held {
				t.Fatalf("seed %d step %d: ledger holds %d, the pool %d", seed, step, out, s.Held)
			}
		}
		// Drain: everything queued is granted in turn, everything granted
		// expires.
		for i := 0; len(s.Granted)+len(s.Queue) > 0; i++ {
			if i > 100_000 {
				t.Fatalf("seed %d: never drained: %+v", seed, s)
			}
			now += min(c.maxDuration(), gap)
			l.now = now
			l.effects(t, Expire(c, &s, now))
			checkInvariant(t, c, &s)
		}
		checked += l.checked
		closest = max(closest, l.closest)
		for id, g := range l.granted {
			if l.returned[id] != g {
				t.Fatalf("seed %d: reservation %d granted %d, returned %d", seed, id, g, l.returned[id])
			}
		}
		if s.Held != 0 || len(s.Clients) != 0 {
			t.Fatalf("seed %d: drained pool still holds %d, clients %+v", seed, s.Held, s.Clients)
		}
	}
}
