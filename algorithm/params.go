package algorithm

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// MaxExact bounds every intermediate value of the algorithms' integer
// arithmetic. It is 2^51, so that the same arithmetic stays exact in the
// IEEE doubles of Redis' Lua (exact up to 2^53) with room for a sum of a few
// such terms.
const MaxExact = 1 << 51

// Params is a validated, compiled Limit: the integers the state transitions
// work with. Time is counted in quanta of Quantum microseconds; Compile picks
// the finest quantum (1 µs where it fits) that keeps Burst x Window within
// MaxExact. A Params is immutable once compiled and safe to share.
type Params struct {
	// Algorithm is the algorithm to apply.
	Algorithm sluice.Algorithm
	// Limit is N, the units admitted per window.
	Limit int64
	// Burst is B, the capacity of the bucket algorithms; equal to Limit for
	// the window algorithms.
	Burst int64
	// Window is W, the window or refill period in quanta.
	Window int64
	// Quantum is Q, the length of one quantum in microseconds: 1, 10, 100,
	// ... or 1,000,000.
	Quantum int64
	// DenyAll is set for a limit that refuses everything.
	DenyAll bool
	// ExpiryLimit is the slowest refill, in units per window, among the
	// Params that decide the same state, such as the priority variants of
	// one rule (see ShareState). ExpiresAt lets a bucket's debt drain at
	// this rate, so that a store forgets the state only once every one of
	// them would decide it as a key never seen. Zero, or a value above
	// Limit, means Limit. Compile leaves it zero.
	ExpiryLimit int64
	// CountRefused makes a fixed window count the cost of the requests it
	// refuses, as envoyproxy/ratelimit does: once over the limit, the
	// window stays over it until it ends, a read (cost 0) included, and
	// Remaining is 0. The count may then exceed Limit (up to MaxExact).
	// A limit of 0 with CountRefused (and not DenyAll) refuses every
	// request of positive cost, counting it, and admits reads until one
	// is counted. The other algorithms ignore it. Compile leaves it false.
	CountRefused bool
}

// countsRefused reports whether p counts the requests it refuses.
func (p *Params) countsRefused() bool {
	return p.CountRefused && p.Algorithm == sluice.FixedWindow && !p.DenyAll
}

// ShareState prepares ps, Params of one algorithm, window and quantum, to
// decide the same state: it sets the ExpiryLimit of each to the smallest
// Limit among them. Deny-all Params write no state and are left out.
func ShareState(ps []Params) {
	var slowest int64
	for i := range ps {
		if l := ps[i].Limit; !ps[i].DenyAll && l > 0 && (slowest == 0 || l < slowest) {
			slowest = l
		}
	}
	for i := range ps {
		ps[i].ExpiryLimit = slowest
	}
}

// expiryRate returns the refill, in scaled units per quantum, at which
// ExpiresAt drains a bucket: the smaller of Limit and a positive
// ExpiryLimit.
func (p *Params) expiryRate() int64 {
	if p.ExpiryLimit > 0 && p.ExpiryLimit < p.Limit {
		return p.ExpiryLimit
	}
	return p.Limit
}

// Compile validates l and returns its Params. The errors wrap
// sluice.ErrInvalidLimit and name the offending field.
func Compile(l sluice.Limit) (Params, error) {
	return CompileAt(l, 1)
}

// CompileAt is Compile at a resolution of at most minQuantum
// microseconds (1, 10, ... or 1,000,000): it picks the finest quantum from
// minQuantum up. Limits of one window that must count on one state layout,
// whatever their size, compile at one quantum this way.
func CompileAt(l sluice.Limit, minQuantum int64) (Params, error) {
	if err := l.Validate(); err != nil {
		return Params{}, err
	}
	p := Params{Algorithm: l.Algorithm, Limit: l.Limit, Burst: l.Capacity(), DenyAll: l.DenyAll}
	switch l.Algorithm {
	case sluice.FixedWindow, sluice.SlidingWindowLog, sluice.SlidingWindowCounter:
		p.Burst = l.Limit
	}
	if p.DenyAll {
		p.Burst = 0
	}
	windowUS := int64(l.Window / time.Microsecond)
	size := max(p.Burst, p.Limit, 1)
	for q := int64(1); q <= 1_000_000; q *= 10 {
		if windowUS%q != 0 {
			break
		}
		if q < minQuantum {
			continue
		}
		w := windowUS / q
		if w >= 1 && size <= MaxExact/w {
			p.Window, p.Quantum = w, q
			return p, nil
		}
	}
	return Params{}, fmt.Errorf("%w: limit x window: %d per %s cannot be counted exactly (burst x window must stay within 2^51 at a resolution of up to one second); use a shorter window or a smaller limit", sluice.ErrInvalidLimit, size, l.Window)
}

// MustCompile is like Compile but panics on an invalid limit. It is meant
// for limits written in code and tests, never for configuration input.
func MustCompile(l sluice.Limit) Params {
	p, err := Compile(l)
	if err != nil {
		panic(err)
	}
	return p
}

// WindowDuration returns the window of p as a time.Duration.
func (p *Params) WindowDuration() time.Duration {
	return time.Duration(p.Window*p.Quantum) * time.Microsecond
}
