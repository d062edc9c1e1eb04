package algorithm

import (
	"math"
	"time"

	"github.com/sluicehq/sluice"
)

// State is the state of one key for every algorithm but the sliding window
// log. Its zero value is the state of a key never seen, which is also the
// state of a key whose limit is fully restored. What A, B and C hold depends
// on the algorithm (see the package documentation).
type State struct {
	A, B, C int64
}

// Apply decides a request of cost units at now (microseconds since the Unix
// epoch) against state s, and returns the new state and the decision. It is
// a pure function: no locks, no I/O, no clock. When the request is denied,
// or cost is 0, the returned state decides every later request as s would.
// cost must not be negative. Apply does not handle SlidingWindowLog (see
// ApplyLog).
func Apply(p *Params, s State, now, cost int64) (State, sluice.Decision) {
	if p.DenyAll {
		return s, sluice.Decision{Reason: sluice.ReasonDenyAll}
	}
	t := floorDiv(now, p.Quantum)
	if cost > p.Burst {
		// Never admitted: report the state as a read does, or as it is
		// once charged when refused requests count.
		if p.countsRefused() {
			ns, d := fixedWindow(p, s, t, cost)
			return ns, exceeds(d)
		}
		_, d := apply(p, s, t, 0)
		return s, exceeds(d)
	}
	return apply(p, s, t, cost)
}

// apply is Apply after the deny-all and capacity checks, at t quanta.
func apply(p *Params, s State, t, cost int64) (State, sluice.Decision) {
	switch p.Algorithm {
	case sluice.TokenBucket, sluice.LeakyBucket:
		return bucket(p, s, t, cost)
	case sluice.GCRA:
		return gcra(p, s, t, cost)
	case sluice.FixedWindow:
		return fixedWindow(p, s, t, cost)
	case sluice.SlidingWindowCounter:
		return slidingCounter(p, s, t, cost)
	}
	// An unknown algorithm or the log: deny rather than admit.
	return s, sluice.Decision{Reason: sluice.ReasonLimited, Limit: p.Limit}
}

// Counts reports whether Apply, deciding a request of cost under p with the
// decision d, changed the state: when it admitted a positive cost, and,
// under CountRefused, when it refused one.
func Counts(p *Params, d sluice.Decision, cost int64) bool {
	return cost > 0 && (d.Allowed || p.countsRefused() && d.Reason != sluice.ReasonDenyAll)
}

// exceeds turns d, the decision of a read (cost 0), into the denial of a
// cost above the capacity: never admitted, so no retry-after, with the
// remaining and reset of the state as it stands.
func exceeds(d sluice.Decision) sluice.Decision {
	d.Allowed, d.Reason, d.RetryAfter = false, sluice.ReasonCostExceedsCapacity, 0
	return d
}

// bucket is the token bucket and the leaky bucket: s.A is the debt (or the
// water) scaled by the window, s.B the instant of the last update.
func bucket(p *Params, s State, t, cost int64) (State, sluice.Decision) {
	debt := drain(s.A, t-s.B, p.Limit)
	last := max(s.B, t)
	// A clock that went back stands still at last: the bucket drains
	// again only from there, lag quanta from now.
	debt, d := bucketDecide(p, debt, cost, last-t)
	if !d.Allowed || cost == 0 {
		return s, d
	}
	return State{A: debt, B: last}, d
}

// drain returns debt after elapsed quanta at a refill of rate scaled units
// per quantum, never below zero. A negative elapsed time drains nothing.
func drain(debt, elapsed, rate int64) int64 {
	if elapsed <= 0 || debt <= 0 {
		return max(debt, 0)
	}
	if elapsed >= ceilDiv(debt, rate) { // also keeps elapsed*rate from overflowing
		return 0
	}
	return debt - elapsed*rate
}

// bucketDecide decides cost against a bucket whose debt, scaled by the
// window, is debt at the instant of the request; it returns the debt after
// the request. The debt starts to drain lag quanta after the request (0
// unless the clock went back), which the waits include.
func bucketDecide(p *Params, debt, cost, lag int64) (int64, sluice.Decision) {
	capacity := p.Burst * p.Window
	next := debt + cost*p.Window
	if cost > 0 && next > capacity {
		return debt, sluice.Decision{
			Reason:     sluice.ReasonLimited,
			Limit:      p.Limit,
			Remaining:  max(capacity-debt, 0) / p.Window,
			ResetAfter: p.Duration(drainTime(debt, p.Limit, lag)),
			RetryAfter: p.Duration(ceilDiv(next-capacity, p.Limit) + lag),
		}
	}
	return next, sluice.Decision{
		Allowed:    true,
		Limit:      p.Limit,
		Remaining:  max(capacity-next, 0) / p.Window,
		ResetAfter: p.Duration(drainTime(next, p.Limit, lag)),
	}
}

// drainTime returns the quanta until debt has drained at rate, starting lag
// quanta from now: 0 when there is no debt.
func drainTime(debt, rate, lag int64) int64 {
	if debt <= 0 {
		return 0
	}
	return ceilDiv(debt, rate) + lag
}

// gcra is the generic cell rate algorithm: the theoretical arrival time is
// s.A + s.B/Limit quanta, with 0 <= s.B < Limit.
func gcra(p *Params, s State, t, cost int64) (State, sluice.Decision) {
	// A state written under a higher Limit sharing it (a priority
	// variant) may hold s.B >= Limit; its TAT is still before s.A + 1,
	// and is counted as s.A + 1, where the debt is zero at any rate.
	frac := min(s.B, p.Limit)
	// The debt of the equivalent bucket is (TAT - t) x Limit.
	var debt, lag int64
	switch full := p.Burst * p.Window / p.Limit; {
	case s.A > t+full:
		// Only a clock that went back gets here: the debt is above the
		// capacity, and may be too large to compute. Decide at t+lag,
		// where it is still above the capacity, and wait lag more.
		lag = s.A - t - full - 1
		debt = (full+1)*p.Limit + frac
	case s.A >= t:
		debt = (s.A-t)*p.Limit + frac
	}
	debt, d := bucketDecide(p, debt, cost, lag)
	if !d.Allowed || cost == 0 {
		return s, d
	}
	return State{A: t + debt/p.Limit, B: debt % p.Limit}, d
}

// fixedWindow: s.A is the start of the current window, s.B the units
// admitted in it.
func fixedWindow(p *Params, s State, t, cost int64) (State, sluice.Decision) {
	start := t - floorMod(t, p.Window)
	count := s.B
	if s.A != start {
		count = 0
		if s.A > start { // the clock went back: keep the later window
			start, count = s.A, s.B
		}
	}
	end := start + p.Window
	d := sluice.Decision{Limit: p.Limit}
	if cost > 0 && count+cost > p.Limit || p.CountRefused && count > p.Limit {
		d.Reason = sluice.ReasonLimited
		d.Remaining = max(p.Limit-count, 0)
		d.ResetAfter = p.Duration(end - t)
		d.RetryAfter = p.Duration(end - t)
		if p.CountRefused && cost > 0 {
			// Refused, and counted all the same (up to MaxExact, far
			// above any limit).
			d.Remaining = 0
			return State{A: start, B: min(count+cost, MaxExact)}, d
		}
		return s, d
	}
	d.Allowed = true
	count += cost
	d.Remaining = max(p.Limit-count, 0)
	if count > 0 {
		d.ResetAfter = p.Duration(end - t)
	}
	if cost == 0 {
		return s, d
	}
	return State{A: start, B: count}, d
}

// slidingCounter: s.A is the start of the current window, s.B the units
// admitted in it, s.C the units admitted in the window before.
func slidingCounter(p *Params, s State, t, cost int64) (State, sluice.Decision) {
	w := p.Window
	start := t - floorMod(t, w)
	cur, prev := s.B, s.C
	switch {
	case s.A == start:
	case s.A == start-w:
		cur, prev = 0, s.B
	case s.A > start: // the clock went back: keep the later windows
		start = s.A
	default:
		cur, prev = 0, 0
	}
	e := max(t-start, 0) // elapsed quanta into the current window
	// A clock that went back stands still at start, lag quanta from now.
	lag := max(start-t, 0)
	// The weighted count, scaled by the window: prev x (W-e) + cur x W.
	weighted := prev*(w-e) + cur*w
	room := p.Limit*w - weighted
	d := sluice.Decision{Limit: p.Limit}
	if cost > 0 && (cur+cost)*w > p.Limit*w-prev*(w-e) {
		d.Reason = sluice.ReasonLimited
		d.Remaining = max(room/w, 0)
		d.ResetAfter = p.Duration(counterReset(w, e, cur, prev, lag))
		d.RetryAfter = p.Duration(counterRetry(p.Limit, w, e, cur, prev, cost) + lag)
		return s, d
	}
	d.Allowed = true
	cur += cost
	d.Remaining = max(room-cost*w, 0) / w
	d.ResetAfter = p.Duration(counterReset(w, e, cur, prev, lag))
	if cost == 0 {
		return s, d
	}
	return State{A: start, B: cur, C: prev}, d
}

// counterReset returns the quanta until both windows of a sliding window
// counter weigh nothing, e quanta into the current window, which starts
// lag quanta from now (0 unless the clock went back).
func counterReset(w, e, cur, prev, lag int64) int64 {
	switch {
	case cur > 0:
		return 2*w - e + lag
	case prev > 0:
		return w - e + lag
	}
	return 0
}

// counterRetry returns the quanta until a request of cost, denied by a
// sliding window counter, would be admitted.
func counterRetry(limit, w, e, cur, prev, cost int64) int64 {
	if free := limit - cur - cost; free >= 0 {
		// Within this window, once the previous window's weight has
		// fallen enough: prev x (W-e-dt) <= free x W.
		return max(w-e-free*w/prev, 1)
	}
	// In the next window, cur becomes the previous window:
	// cur x (W-e2) <= (limit-cost) x W.
	e2 := max(w-(limit-cost)*w/cur, 0)
	return w - e + e2
}

// ApplyLog decides a request for the sliding window log. log holds the
// admission instants in quanta, oldest first, one entry per unit of cost
// admitted; entries older than the window may be present and are dropped.
// It returns the new log, which may share log's array, and the decision.
// When the request is denied, or cost is 0, log's array is left untouched.
func ApplyLog(p *Params, log []int64, now, cost int64) ([]int64, sluice.Decision) {
	if p.DenyAll {
		return log, sluice.Decision{Reason: sluice.ReasonDenyAll}
	}
	if cost > p.Burst {
		// Never admitted: report the log as a read does (a read leaves
		// log's array untouched).
		live, d := ApplyLog(p, log, now, 0)
		return live, exceeds(d)
	}
	t := floorDiv(now, p.Quantum)
	k := 0 // entries at or before t-W have left the window (t-W, t]
	for k < len(log) && log[k] <= t-p.Window {
		k++
	}
	live := log[k:]
	n := int64(len(live))
	d := sluice.Decision{Limit: p.Limit}
	if cost > 0 && n+cost > p.Limit {
		d.Reason = sluice.ReasonLimited
		d.Remaining = max(p.Limit-n, 0)
		d.ResetAfter = p.Duration(live[len(live)-1] + p.Window - t)
		// The oldest n+cost-limit entries must leave the window.
		d.RetryAfter = p.Duration(live[n+cost-p.Limit-1] + p.Window - t)
		return live, d
	}
	d.Allowed = true
	d.Remaining = max(p.Limit-n-cost, 0)
	if cost == 0 {
		if n > 0 {
			d.ResetAfter = p.Duration(live[n-1] + p.Window - t)
		}
		return live, d
	}
	newest := t
	if n > 0 {
		newest = max(live[n-1], t) // keep the log sorted if the clock went back
	}
	if k > 0 {
		log = log[:copy(log, live)]
	}
	for range cost {
		log = append(log, newest)
	}
	d.ResetAfter = p.Duration(newest + p.Window - t)
	return log, d
}

// ExpiresAt returns the instant, in microseconds since the Unix epoch, from
// which s is equivalent to the zero State under p, so a store may forget
// it. When p.ExpiryLimit is set, s is then also equivalent to the zero
// State under every Params that shares it (see ShareState). For the sliding
// window log, pass the newest entry of the log in s.A. An instant beyond
// the largest int64 (a bucket whose burst is so far above its limit that
// it takes some 300,000 years to restore) is reported as math.MaxInt64.
func ExpiresAt(p *Params, s State) int64 {
	var q int64 // in quanta
	switch p.Algorithm {
	case sluice.TokenBucket, sluice.LeakyBucket:
		if s.A <= 0 {
			return 0
		}
		q = s.B + ceilDiv(s.A, p.expiryRate())
	case sluice.GCRA:
		// TAT is an instant, past which the debt is zero at any rate.
		q = s.A
		if s.B > 0 {
			q++
		}
	case sluice.FixedWindow:
		if s.B == 0 {
			return 0
		}
		q = s.A + p.Window
	case sluice.SlidingWindowCounter:
		switch {
		case s.B > 0:
			q = s.A + 2*p.Window
		case s.C > 0:
			q = s.A + p.Window
		default:
			return 0
		}
	case sluice.SlidingWindowLog:
		q = s.A + p.Window
	}
	if q > math.MaxInt64/p.Quantum {
		return math.MaxInt64
	}
	return q * p.Quantum
}

// Duration converts q quanta of p to a time.Duration, saturating at the
// largest Duration (about 292 years): a bucket whose burst is many times its
// limit can take longer than that to restore.
func (p *Params) Duration(q int64) time.Duration {
	if q < 1<<33 { // within range at every quantum up to a second
		return time.Duration(q*p.Quantum) * time.Microsecond
	}
	if q > math.MaxInt64/int64(time.Microsecond)/p.Quantum {
		return math.MaxInt64
	}
	return time.Duration(q*p.Quantum) * time.Microsecond
}

// floorDiv returns a / b rounded towards minus infinity; b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// floorMod returns a mod b in [0, b); b > 0.
func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// ceilDiv returns a / b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	return (a + b - 1) / b
}
