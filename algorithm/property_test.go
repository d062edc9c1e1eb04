package algorithm

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// This file holds a brute-force reference model of every algorithm, in
// exact rationals and written from the definitions of the package
// documentation rather than from the code, and property tests that compare
// the two on random traces, and that check every Decision against what
// the next checks decide.

// refModel decides requests at whole quanta t, never going back.
type refModel interface {
	// decide returns whether cost is admitted at t, and consumes it if so.
	decide(t, cost int64) bool
	// clone returns an independent copy.
	clone() refModel
}

func rat(a, b int64) *big.Rat { return new(big.Rat).SetFrac64(a, b) }

// refBucket is the token bucket: tokens refill continuously at N per W
// quanta up to K; a request takes cost tokens when there are that many.
type refBucket struct {
	n, w, k int64
	tokens  *big.Rat
	last    int64
}

func (b *refBucket) decide(t, cost int64) bool {
	if b.tokens == nil {
		b.tokens, b.last = rat(b.k, 1), t
	}
	refill := rat((t-b.last)*b.n, b.w)
	b.tokens.Add(b.tokens, refill)
	if b.tokens.Cmp(rat(b.k, 1)) > 0 {
		b.tokens = rat(b.k, 1)
	}
	b.last = t
	if b.tokens.Cmp(rat(cost, 1)) < 0 {
		return false
	}
	b.tokens.Sub(b.tokens, rat(cost, 1))
	return true
}

func (b *refBucket) clone() refModel {
	c := *b
	if b.tokens != nil {
		c.tokens = new(big.Rat).Set(b.tokens)
	}
	return &c
}

// refGCRA is GCRA: the theoretical arrival time moves by W/N per unit
// from max(TAT, t); a request is admitted when the new TAT is at most
// t + K·W/N.
type refGCRA struct {
	n, w, k int64
	tat     *big.Rat
}

func (g *refGCRA) decide(t, cost int64) bool {
	tat := rat(t, 1)
	if g.tat != nil && g.tat.Cmp(tat) > 0 {
		tat.Set(g.tat)
	}
	tat.Add(tat, rat(cost*g.w, g.n))
	bound := new(big.Rat).Add(rat(t, 1), rat(g.k*g.w, g.n))
	if tat.Cmp(bound) > 0 {
		return false
	}
	g.tat = tat
	return true
}

func (g *refGCRA) clone() refModel {
	c := *g
	if g.tat != nil {
		c.tat = new(big.Rat).Set(g.tat)
	}
	return &c
}

// refFixed counts per window [iW, (i+1)W).
type refFixed struct {
	n, w  int64
	count map[int64]int64
}

func (f *refFixed) decide(t, cost int64) bool {
	i := floorDiv(t, f.w)
	if f.count[i]+cost > f.n {
		return false
	}
	f.count[i] += cost
	return true
}

func (f *refFixed) clone() refModel {
	c := &refFixed{n: f.n, w: f.w, count: map[int64]int64{}}
	for k, v := range f.count {
		c.count[k] = v
	}
	return c
}

// refLog keeps every admitted unit; the window is (t-W, t].
type refLog struct {
	n, w int64
	at   []int64
}

func (l *refLog) decide(t, cost int64) bool {
	live := int64(0)
	for _, a := range l.at {
		if a > t-l.w {
			live++
		}
	}
	if live+cost > l.n {
		return false
	}
	for range cost {
		l.at = append(l.at, t)
	}
	return true
}

func (l *refLog) clone() refModel {
	return &refLog{n: l.n, w: l.w, at: append([]int64(nil), l.at...)}
}

// refCounter weighs the previous window by the part of it still inside the
// sliding window: count = prev·(W-e)/W + cur.
type refCounter struct {
	n, w  int64
	count map[int64]int64
}

func (c *refCounter) decide(t, cost int64) bool {
	i := floorDiv(t, c.w)
	e := t - i*c.w
	cnt := rat(c.count[i-1]*(c.w-e), c.w)
	cnt.Add(cnt, rat(c.count[i]+cost, 1))
	if cnt.Cmp(rat(c.n, 1)) > 0 {
		return false
	}
	c.count[i] += cost
	return true
}

func (c *refCounter) clone() refModel {
	d := &refCounter{n: c.n, w: c.w, count: map[int64]int64{}}
	for k, v := range c.count {
		d.count[k] = v
	}
	return d
}

func newRef(p *Params) refModel {
	switch p.Algorithm {
	case sluice.TokenBucket, sluice.LeakyBucket:
		return &refBucket{n: p.Limit, w: p.Window, k: p.Burst}
	case sluice.GCRA:
		return &refGCRA{n: p.Limit, w: p.Window, k: p.Burst}
	case sluice.FixedWindow:
		return &refFixed{n: p.Limit, w: p.Window, count: map[int64]int64{}}
	case sluice.SlidingWindowLog:
		return &refLog{n: p.Limit, w: p.Window}
	case sluice.SlidingWindowCounter:
		return &refCounter{n: p.Limit, w: p.Window, count: map[int64]int64{}}
	}
	panic("unknown algorithm")
}

// subject is the implementation under test: one key's state.
type subject struct {
	p   *Params
	s   State
	log []int64
}

func (x *subject) apply(now, cost int64) sluice.Decision {
	var d sluice.Decision
	if x.p.Algorithm == sluice.SlidingWindowLog {
		x.log, d = ApplyLog(x.p, x.log, now, cost)
	} else {
		x.s, d = Apply(x.p, x.s, now, cost)
	}
	return d
}

func (x *subject) clone() *subject {
	c := *x
	c.log = append([]int64(nil), x.log...)
	return &c
}

// randomParams returns random Params, mostly small enough to search by
// brute force, sometimes at a coarser quantum.
func randomParams(rng *rand.Rand, a sluice.Algorithm) Params {
	var l sluice.Limit
	l.Algorithm = a
	if rng.IntN(8) == 0 && a != sluice.SlidingWindowLog {
		// Large limits: a quantum of 10 or 100 µs.
		l.Limit = 1<<40 - rng.Int64N(1000)
		l.Window = time.Duration(10_000*(1+rng.Int64N(3))) * time.Microsecond
		if rng.IntN(3) == 0 {
			l.Window *= 10
		}
	} else {
		l.Limit = 1 + rng.Int64N(12)
		l.Window = time.Duration(1+rng.Int64N(40)) * time.Microsecond
	}
	if rng.IntN(2) == 0 {
		l.Burst = min(1+rng.Int64N(2*l.Limit), sluice.MaxLimit)
	}
	p, err := Compile(l)
	if err != nil {
		panic(err)
	}
	return p
}

// randomCost returns a cost in [0, K+1], mostly small.
func randomCost(rng *rand.Rand, k int64) int64 {
	switch rng.IntN(10) {
	case 0:
		return 0
	case 1:
		return k + 1
	case 2:
		return 1 + rng.Int64N(k)
	}
	if k > 1000 {
		return 1 + rng.Int64N(k/3)
	}
	return 1 + rng.Int64N(min(k, 3))
}

// at returns an instant in microseconds within quantum t of p.
func at(rng *rand.Rand, p *Params, t int64) int64 {
	return t*p.Quantum + rng.Int64N(p.Quantum)
}

// firstAdmit returns the least x >= 0 such that model admits cost at t+x
// quanta, searching up to limit; -1 when there is none.
func firstAdmit(m refModel, t, cost, limit int64) int64 {
	// Admission is monotone in the wait for every algorithm.
	lo, hi := int64(0), limit
	if !m.clone().decide(t+hi, cost) {
		return -1
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if m.clone().decide(t+mid, cost) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// horizon is a wait after which every algorithm is restored under p.
func horizon(p *Params) int64 {
	return 2*p.Window + ceilDiv(p.Burst*p.Window, p.Limit) + 2
}

// TestPropertyMatchesReference replays random traces on the
// implementation and on the reference model of each algorithm, and
// requires the same admissions, and Remaining and RetryAfter as the model
// computes them by brute force.
func TestPropertyMatchesReference(t *testing.T) {
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 11))
			for trace := range 200 {
				p := randomParams(rng, a)
				x, ref := &subject{p: &p}, newRef(&p)
				tq := floorDiv(t0, p.Quantum) + rng.Int64N(3*p.Window)
				for i := range 60 {
					if rng.IntN(3) > 0 {
						tq += rng.Int64N(p.Window/2 + 2)
					}
					now, cost := at(rng, &p, tq), randomCost(rng, p.Burst)
					before := ref.clone()
					d := x.apply(now, cost)
					where := fmt.Sprintf("trace %d (%+v), request %d: cost %d at quantum %d", trace, p, i, cost, tq)
					if cost > p.Burst {
						if d.Allowed || d.Reason != sluice.ReasonCostExceedsCapacity {
							t.Fatalf("%s: got %+v, want cost_exceeds_capacity", where, d)
						}
						continue
					}
					if want := ref.decide(tq, cost); d.Allowed != want {
						t.Fatalf("%s: allowed %v, the reference model %v (%+v)", where, d.Allowed, want, d)
					}
					// Remaining: the most the model admits right now.
					after := ref
					if !d.Allowed {
						after = before
					}
					if want := remainingOf(after, tq, p.Burst); d.Remaining != want {
						t.Fatalf("%s: remaining %d, the reference model %d (%+v)", where, d.Remaining, want, d)
					}
					if !d.Allowed {
						want := firstAdmit(before, tq, cost, horizon(&p))
						if got := d.RetryAfter.Microseconds(); got != want*p.Quantum {
							t.Fatalf("%s: retry after %dµs, the reference model admits it after %dµs (%+v)", where, got, want*p.Quantum, d)
						}
					}
				}
			}
		})
	}
}

// remainingOf returns the most units model admits at t, up to most.
func remainingOf(m refModel, t, most int64) int64 {
	lo, hi := int64(0), most
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if m.clone().decide(t, mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// TestPropertyDecisionsHold checks every decision on random traces, with
// the clock going back now and then, against what the implementation
// itself decides next: a request that waits RetryAfter is admitted and one
// that waits a quantum less is not; Remaining units are admitted at once
// and one more is not; from ResetAfter on, and from ExpiresAt on, the
// state decides as a key never seen.
func TestPropertyDecisionsHold(t *testing.T) {
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 12))
			for trace := range 200 {
				p := randomParams(rng, a)
				x := &subject{p: &p}
				tq := floorDiv(t0, p.Quantum)
				for i := range 60 {
					switch r := rng.IntN(10); {
					case r == 0:
						tq -= rng.Int64N(2*p.Window + 2) // the clock goes back
					case r < 7:
						tq += rng.Int64N(p.Window/2 + 2)
					}
					now, cost := at(rng, &p, tq), randomCost(rng, p.Burst)
					before := x.clone()
					d := x.apply(now, cost)
					where := fmt.Sprintf("trace %d (%+v), request %d: cost %d at %dµs", trace, p, i, cost, now)
					checkDecision(t, where, before, x, now, cost, d)
				}
			}
		})
	}
}

// checkDecision checks decision d of cost at now, taken on state before
// and leaving state after.
func checkDecision(t *testing.T, where string, before, after *subject, now, cost int64, d sluice.Decision) {
	t.Helper()
	p := before.p
	q := p.Quantum
	tq := floorDiv(now, q)
	if d.Remaining < 0 || d.ResetAfter < 0 || d.RetryAfter < 0 {
		t.Fatalf("%s: negative field in %+v", where, d)
	}
	if d.Reason == sluice.ReasonCostExceedsCapacity {
		// Never admitted: the state as a read reports it.
		if e := before.clone().apply(now, 0); d.Remaining != e.Remaining || d.ResetAfter != e.ResetAfter {
			t.Fatalf("%s: cost %d above the capacity: %+v, a read: %+v", where, cost, d, e)
		}
		return
	}
	// Remaining units are admitted now, one more is not.
	if r := d.Remaining; r > 0 {
		if e := after.clone().apply(now, r); !e.Allowed {
			t.Fatalf("%s: %+v, then the %d remaining denied: %+v", where, d, r, e)
		}
	}
	if r := d.Remaining + 1; r <= p.Burst {
		if e := after.clone().apply(now, r); e.Allowed {
			t.Fatalf("%s: %+v, then %d (one more than remaining) admitted: %+v", where, d, r, e)
		}
	}
	// The same request after RetryAfter is admitted, a quantum earlier not.
	if !d.Allowed {
		w := d.RetryAfter.Microseconds()
		if w <= 0 || w%q != 0 {
			t.Fatalf("%s: denied with retry after %v", where, d.RetryAfter)
		}
		if e := before.clone().apply(now+w, cost); !e.Allowed {
			t.Fatalf("%s: %+v, then the same request after RetryAfter denied: %+v", where, d, e)
		}
		if e := before.clone().apply((tq+w/q)*q-1, cost); e.Allowed {
			t.Fatalf("%s: %+v, then the same request a quantum before RetryAfter admitted: %+v", where, d, e)
		}
	}
	// From ResetAfter on, the state decides as a key never seen, a quantum
	// earlier it does not.
	reset := d.ResetAfter.Microseconds()
	if reset%q != 0 {
		t.Fatalf("%s: reset after %v is not whole quanta", where, d.ResetAfter)
	}
	fresh := &subject{p: p}
	for _, c := range []int64{0, 1, p.Burst} {
		got, want := after.clone().apply(now+reset, c), fresh.clone().apply(now+reset, c)
		if got != want {
			t.Fatalf("%s: %+v, then cost %d after ResetAfter: %+v, a key never seen: %+v", where, d, c, got, want)
		}
	}
	if reset > 0 {
		if e := after.clone().apply((tq+reset/q)*q-1, 0); e.ResetAfter != time.Duration(q)*time.Microsecond {
			t.Fatalf("%s: %+v, then a read a quantum before ResetAfter: %+v, want reset after one quantum", where, d, e)
		}
	}
	// From ExpiresAt on, the same.
	s := after.s
	if p.Algorithm == sluice.SlidingWindowLog {
		if len(after.log) == 0 {
			return
		}
		s = State{A: after.log[len(after.log)-1]}
	}
	exp := ExpiresAt(p, s)
	if exp <= 0 {
		exp = now
	}
	for _, c := range []int64{0, 1, p.Burst} {
		at := max(exp, now)
		got, want := after.clone().apply(at, c), fresh.clone().apply(at, c)
		if got != want {
			t.Fatalf("%s: %+v, then cost %d at ExpiresAt (%dµs): %+v, a key never seen: %+v", where, d, c, exp, got, want)
		}
	}
}

// TestPropertySharedState runs random traces whose requests each use one
// of three Params sharing the state (a rule's priority variants, 0.8x, 1x
// and 1.2x), and checks every decision as TestPropertyDecisionsHold does,
// under the Params that took it, and ExpiresAt under every Params.
func TestPropertySharedState(t *testing.T) {
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 13))
			for trace := range 200 {
				base := randomParams(rng, a)
				var ps [3]Params
				q := base.Quantum
				for i, m := range []float64{0.8, 1, 1.2} {
					l := sluice.Limit{Algorithm: a, Window: base.WindowDuration(),
						Limit: max(int64(float64(base.Limit)*m), 1), Burst: max(int64(float64(base.Burst)*m), 1)}
					l.Limit, l.Burst = min(l.Limit, sluice.MaxLimit), min(l.Burst, sluice.MaxLimit)
					p, err := CompileAt(l, q)
					if err != nil {
						t.Fatal(err)
					}
					ps[i], q = p, max(q, p.Quantum)
				}
				for i := range ps {
					ps[i], _ = CompileAt(sluice.Limit{Algorithm: a, Window: base.WindowDuration(), Limit: ps[i].Limit, Burst: ps[i].Burst}, q)
				}
				ShareState(ps[:])
				x := &subject{p: &ps[1]}
				tq := floorDiv(t0, q)
				for i := range 60 {
					switch r := rng.IntN(10); {
					case r == 0:
						tq -= rng.Int64N(2*ps[1].Window + 2)
					case r < 7:
						tq += rng.Int64N(ps[1].Window/2 + 2)
					}
					x.p = &ps[rng.IntN(3)]
					now, cost := at(rng, x.p, tq), randomCost(rng, x.p.Burst)
					before := x.clone()
					d := x.apply(now, cost)
					where := fmt.Sprintf("trace %d (%+v), request %d: cost %d at %dµs", trace, *x.p, i, cost, now)
					checkDecision(t, where, before, x, now, cost, d)
					// Whichever Params wrote it, the state is forgotten
					// only once it is restored under every one.
					s := x.s
					if a == sluice.SlidingWindowLog {
						if len(x.log) == 0 {
							continue
						}
						s = State{A: x.log[len(x.log)-1]}
					}
					exp := max(ExpiresAt(x.p, s), now)
					for j := range ps {
						other := x.clone()
						other.p = &ps[j]
						for _, c := range []int64{0, 1, ps[j].Burst} {
							got, want := other.clone().apply(exp, c), (&subject{p: &ps[j]}).apply(exp, c)
							if got != want {
								t.Fatalf("%s: %+v, then cost %d under %+v at ExpiresAt (%dµs): %+v, a key never seen: %+v", where, d, c, ps[j], exp, got, want)
							}
						}
					}
				}
			}
		})
	}
}
