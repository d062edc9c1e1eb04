package globalsync

import "math"

// The reserve, and the overshoot it bounds.
//
// Region i admits a request of a global limit L iff
//
//	own_i + Σ_{o≠i} (seen_o + R_o) < L
//
// where seen_o is origin o's latest count we hold for the window and R_o
// the reserve for o. Let U_o(t) = c_o(t) - seen_o(t) be what o has
// admitted in the window that we have not seen at time t: its admissions
// during the span between the read of its count we hold and t. That
// span is its sync lag l_o (send to arrival) plus up to one flush period
// F (a count waits up to F in the sender's batch), so U_o ≈ a_o·(l_o+F),
// a_o being o's admission rate for the key.
//
// Take the region j that admitted last in the window, at t_j; every other
// region admitted its last request no later, so the window's final total
// is c_j(t_j) + Σ_{o≠j} c_o(t_j). At t_j, j's admission test passed:
// c_j(t_j) ≤ L - Σ_{o≠j}(seen_o + R_o). Hence
//
//	total - L ≤ Σ_{o≠j} (U_o - R_o) ≤ Σ_{o≠j} max(0, U_o - R_o)
//
// With R_o = r̂_o·(l̂_o + F) (estimated rate times estimated lag), the
// overshoot is at most the sum over the other regions of their admission
// rate times the part of the lag the estimate does not cover:
//
//	overshoot ≤ Σ_{o≠j} ( a_o·max(0, l_o - l̂_o) + max(0, a_o - r̂_o)·(l̂_o + F) )
//
// It is zero when the rates and lags are estimated from above; a sudden
// burst (a_o > r̂_o until the EWMA catches up) or a lag spike above the
// recent p95 is what gets through. The price of the reserve is the
// converse: admissions refused while the reserve exceeds what the others
// will really admit, at most Σ r̂_o·(l̂_o+F) per window.

// Silence is read as idleness, which holds while the link to the origin
// is up. During a partition no count arrives, the reserve fades, and a
// region admits up to the whole limit less what it saw before: the
// overshoot is then the others' admissions during the partition. The
// caller sees a partition in Status (a peer's LastSync growing old) and
// is the one to fall back to its share of the limit.

// reserve returns what an origin may have admitted for a key that we have
// not seen yet: its rate for the key (per ms) times its sync lag plus one
// flush period (ms). idle is the time since its last count for the key
// arrived (ms). An origin that admits sends its new count every flush
// period, so silence for longer than lag+2·flush means it admitted
// nothing meanwhile: the rate then decays as horizon/idle rather than
// reserving for traffic that has stopped.
func reserve(rate float64, lag, flush, idle int64) float64 {
	if rate <= 0 || math.IsNaN(rate) {
		return 0
	}
	lag = max(lag, 0)
	flush = max(flush, 0)
	r := rate * float64(lag+flush)
	if horizon := lag + 2*flush; idle > horizon {
		r *= float64(max(horizon, 1)) / float64(idle)
	}
	return r
}

// rateHalfLife is how fast the rate estimate forgets: a change of rate is
// half taken in after this many milliseconds. Short enough to follow a
// burst within a second, long enough to smooth the batching.
const rateHalfLife = 500

// rateTau is the EWMA's time constant in ms: half-life / ln 2.
const rateTau = rateHalfLife / math.Ln2

// ewma folds an increase of delta counts over dt ms into a rate (counts
// per ms). It weighs by elapsed time, alpha = 1 - e^(-dt/τ), so batches
// arriving at irregular intervals, or two at once from two instances of
// one region, count for their time and no more: as dt → 0 the change
// tends to delta/τ rather than to delta/dt.
func ewma(rate float64, delta int64, dt int64) float64 {
	if delta < 0 {
		delta = 0
	}
	if dt <= 0 {
		return rate + float64(delta)/rateTau
	}
	alpha := -math.Expm1(-float64(dt) / rateTau)
	return rate + alpha*(float64(delta)/float64(dt)-rate)
}
