// Package algorithm holds Sluice's six rate-limiting algorithms as pure state
// transitions,
//
//	(state, now, cost, limit) -> (state, decision)
//
// with no locks, no I/O and no clock: the stores (store/memory, store/redis)
// keep the state and make each transition one atomic step, and the caller
// says what time it is. This documentation is the reference for what every
// algorithm decides; the Lua scripts of the Redis store compute the same
// integers in the same order, and the conformance suite in store/storetest
// holds them to it.
//
// # Parameters
//
// A sluice.Limit names an algorithm and three numbers:
//
//   - Limit (N): the units of cost admitted per Window. At least 1, at most
//     sluice.MaxLimit, unless the limit is an explicit deny-all.
//   - Window (W): the window of the window algorithms, and for the bucket
//     algorithms the time the bucket takes to restore N units. Positive, a
//     whole number of microseconds, at most a year (sluice.MaxWindow).
//   - Burst (B): the capacity of token bucket, leaky bucket and GCRA, the most
//     units admitted at once after a long pause. Zero means N; at least 1
//     otherwise. The window algorithms admit at most N per window and ignore
//     Burst.
//
// Compile validates a Limit and turns it into Params, the integers the
// transitions work with. Time is counted in quanta of Params.Quantum
// microseconds (1 µs unless B x W would exceed MaxExact), and every
// intermediate value stays within MaxExact = 2^51, so that the same
// arithmetic is exact in the IEEE doubles of Redis' Lua.
//
// # Outputs
//
// Every transition returns a sluice.Decision:
//
//   - Allowed: whether the request is admitted; if so, its cost is consumed.
//   - Limit: N.
//   - Remaining: how many units could still be admitted right now, after this
//     request (floor, never negative).
//   - ResetAfter: how long from now until the limit is fully restored, that
//     is until the state is equivalent to a key never seen, if nothing else
//     arrives. A store adds it to the check's instant to give reset_at.
//   - RetryAfter: when denied, the shortest wait after which the same request
//     would be admitted if nothing else arrived; 0 when allowed.
//
// Durations are whole quanta, rounded up where rounding matters: a client
// that waits RetryAfter is admitted. A duration longer than the largest
// time.Duration (about 292 years) is reported as that largest Duration; only
// a bucket whose burst is far above its limit (1 per day with a burst of
// 200,000 takes 547 years to restore) comes near it.
//
// # Cost
//
// A request of cost c > 0 consumes c units when admitted and nothing when
// denied. Cost 0 reads: it is always allowed (but by a deny-all limit),
// consumes nothing, and reports Remaining and ResetAfter as they stand. A
// cost that can never be admitted, above B for the bucket algorithms or
// above N for the window algorithms, is denied with
// sluice.ReasonCostExceedsCapacity and a RetryAfter of 0, not with an endless
// wait; its Remaining and ResetAfter are those a read reports. A deny-all limit denies everything with sluice.ReasonDenyAll.
//
// A state may hold more than the limit allows when it was written under
// other Params that share it (a rule's priority variants, see ShareState),
// or under a higher limit since lowered. Decided under the lower limit, it
// denies every request of positive cost and reports Remaining 0 until
// enough has drained or the window has passed; a read is still allowed.
//
// # State
//
// State is three integers, A, B and C, whose zero value is the state of a key
// never seen. A denied request or a read returns a state that decides every
// later request as the old one would, so a store may skip the write. Time in
// the state is in quanta since the Unix epoch; t below is the instant of the
// request in quanta (rounded down). A clock that goes back is treated as
// standing still: no algorithm refills or slides for negative elapsed time,
// and the waits it reports (RetryAfter, ResetAfter) count from the instant
// the state stands at, so that a client that waits them is still admitted.
// (GCRA's state is an instant: a clock that goes back finds it further
// away, and its waits run to it.)
//
// In the formulas below, N is the limit, W the window and K the burst (the
// capacity), all as in Params; s.A, s.B and s.C are the fields of State.
//
// Token bucket. s.A = the debt, the units missing from a full bucket scaled
// by W (so that a refill of N units per W quanta is N scaled units per
// quantum, an integer); s.B = the instant of the last update. The bucket
// refills continuously: the debt falls by N per quantum elapsed, to zero at
// the least. A request of cost c > 0 is admitted when debt + c·W <= K·W,
// and then adds c·W to the debt. Remaining = floor(max(K·W - debt, 0) / W);
// ResetAfter = ceil(debt / N) quanta; RetryAfter = ceil((debt + c·W - K·W) /
// N) quanta.
//
// Leaky bucket, as a meter. s.A = the water in the bucket scaled by W, s.B =
// the instant of the last leak. Water leaks at N units per W; a request of
// cost c is admitted while the bucket has room for it (water + c·W <= K·W),
// and then pours c units in. This is the token bucket read the other way
// round, water for debt, and the two decide alike for equal parameters: the
// leaky bucket as a meter and the token bucket are one algorithm. (The
// leaky bucket as a queue, which delays requests to a steady outflow, is not
// a decision a rate limiter returns, and is not offered.)
//
// Fixed window. s.A = the start of the current window, aligned to the epoch
// (t - t mod W), s.B = the units admitted in it; a new window starts from 0.
// A request is admitted when s.B + c <= N. Remaining = max(N - s.B, 0);
// RetryAfter and, once anything was admitted, ResetAfter are the time to the
// end of the window. Up to 2N can pass around a window boundary: use a
// sliding window where that matters.
//
// Sliding window log. The state is the log of admission instants, one entry
// per unit of cost, oldest first (ApplyLog). The window is (t - W, t]: an
// entry admitted at s counts until s + W. A request is admitted when the
// entries in the window plus c are at most N. RetryAfter is the time until
// enough of the oldest entries have left; ResetAfter the time until the
// newest has. It is exact, and costs O(N) memory per key (8 bytes an entry
// in process); the memory store refuses limits above its MaxLogEntries, and
// the sliding window counter is the constant-memory alternative.
//
// Sliding window counter. s.A = the start of the current window (aligned as
// for the fixed window), s.B = the units admitted in it, s.C = the units
// admitted in the window before. The count at elapsed time e into the
// current window weights the previous window by the part of it still inside
// the sliding window: s.C·(W-e)/W + s.B. With 80 in the previous window and
// 30 in the current one, halfway through, the count is 80·0.5 + 30 = 70. A
// request is admitted when s.C·(W-e) + (s.B+c)·W <= N·W (exact, in
// integers); Remaining = floor(N - count). It assumes the previous window's
// admissions were spread evenly, so on bursty traffic it can admit a little
// more or less than the exact log; docs/PERFORMANCE.md gives how often it
// decides differently on a synthetic trace.
//
// GCRA, the generic cell rate algorithm. The state is one instant, the
// theoretical arrival time TAT = s.A + s.B/N quanta (s.A whole quanta and a
// remainder s.B in [0, N), so that the emission interval W/N stays exact).
// A request of cost c moves TAT to max(TAT, t) + c·W/N and is admitted when
// the new TAT is at most t + K·W/N; otherwise TAT stays as it was. (A
// state written under a higher limit sharing it may hold s.B >= N; its TAT
// was before s.A + 1, and is read as s.A + 1.) GCRA
// decides exactly as the token bucket with the same parameters (its debt is
// (TAT - t)·N) but keeps one instant instead of a level and a time.
package algorithm
