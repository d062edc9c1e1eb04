// Package reservation holds the core of Sluice's reservations of capacity:
// a pool of tokens that clients reserve ahead, use, and give back, and the
// queue in which they wait their turn, as pure state transitions,
//
//	(config, state, now, request) -> (state, result, effects)
//
// with no locks, no I/O and no clock, in the manner of package algorithm.
// The stores keep the State and make each transition one atomic step; the
// caller says what time it is. The state is plain integers and small
// records so that a Redis Lua script can hold and change it in the same
// order, with the same arithmetic.
//
// # Pool and units
//
// A pool belongs to one (resource, limit) and has Config.Capacity tokens.
// Time is in microseconds since the Unix epoch, as in package algorithm;
// durations are in microseconds. Every integer stays within MaxExact
// (2^51), so that Lua's doubles compute it exactly: this is why
// Config.Validate bounds the capacity, the weights, and the capacity times
// the queue limit (the virtual time a client's whole backlog can cost).
//
// State.Held is the number of tokens granted and not yet returned; the
// pool's free tokens are Capacity - Held. The zero State is a pool never
// used: every token free, nobody queued.
//
// # State
//
// State holds three integers (Held, Virtual, LastID) and three small
// collections: Clients (by name: Finish, Held, Queued), Queue (the
// requests waiting, in arrival order) and Granted (the reservations not yet
// expired). Every field is an integer or a client's name, and nothing is
// derived from an index that would have to be kept in step: the order of
// the queue is computed from the fields at each call. A Redis store can
// keep a pool as one hash of the integers and the clients, and the two
// collections as hashes of records by ID; each transition reads them all,
// which the queue limit keeps small.
//
// # Reservations
//
// Reserve(Ask{client, tokens, duration, priority}) at now is refused with an
// *InvalidError (which wraps ErrInvalid and names the field) when the
// client is empty, tokens <= 0, tokens above what the pool could ever
// grant the client (the capacity, or the client's MaxBurst), duration <= 0
// or above Config.MaxDuration (at most 300 s), or the priority is not
// High, Normal or Low. It is refused with ErrQueueFull when
// Config.QueueLimit requests are queued (after what was due at now was
// expired and granted). Otherwise it is queued, and the queue is granted
// from its head (see Granting): if the new request is granted at once its
// Result has Position 0 and ExpiresAt = now + duration; else the Result
// gives its Position in the queue (1 for the head) and EstimatedAt, an
// estimate of its grant instant.
//
// A granted reservation (a Reservation) holds its tokens as a balance.
// Use(id, n) draws n from the balance into use (refused with
// ErrInsufficient if n exceeds the balance: the balance never goes below
// 0). Complete(id, n) ends n tokens of use and returns them to the pool.
// Release(id) returns the balance to the pool and sets it to 0; releasing
// again returns nothing (the record stays, marked Released, until it
// expires, so that a second release is recognised rather than an error;
// the pool thus keeps a record of each reservation for its duration, at
// most 300 s).
// At ExpiresAt the reservation expires: whatever it still holds, balance
// and tokens in use, goes back to the pool and the record is removed; a
// Use, Complete or Release after that gets ErrNotFound. Every token is thus
// returned exactly once: by Complete, by Release or by expiry, and the
// invariant
//
//	Held = sum over reservations of (Balance + InUse) <= Capacity
//
// holds after every transition. Cancel(id) removes a queued request;
// granted reservations are released, not cancelled (ErrNotQueued).
//
// Every transition first expires the reservations whose ExpiresAt <= now
// (Reserve also grants what that frees, before it queues the new request,
// which arrived after them), and ends by granting from the queue. The
// caller need not call Expire before each one; Expire(now) alone is for a
// periodic sweep.
//
// # The queue: weighted fair queuing
//
// Each client has a Quota (fairness_quotas): Weight, its share of the pool
// under contention; MinGuaranteed, the tokens up to which its requests go
// ahead of the others' (see Order); MaxBurst, the most tokens it may hold
// at once. Config.Validate keeps the guarantees' sum within the capacity.
// Fairness is by virtual finish time. The pool keeps a virtual time V,
// and each client the finish tag F of its last request. A request of t
// tokens from a client of weight w gets
//
//	start  = max(V, F)
//	finish = start + ceil(t · VirtualScale / w),   and F becomes finish.
//
// VirtualScale (720720, divisible by every integer up to 16) keeps the
// division exact for the usual weights. When a request is granted, V
// becomes max(V, its start). A client that has been idle starts again at V,
// so it cannot bank credit; a backlogged client's tags advance in steps
// inversely proportional to its weight, so that backlogged clients are
// granted tokens in the ratio of their weights. When V passes 2^44 every
// tag is shifted down by V (which keeps their order) so that they stay
// within MaxExact. A pool with no reservation and nothing queued is idle:
// it forgets V and every client, and decides as the zero State.
//
// # Order and priorities
//
// Priorities are High, Normal and Low, of class 0, 1 and 2. A request ages: a
// request of class k that has waited w has the effective class
//
//	e = k - floor(w / P),  P = Config.AgingPeriod,
//
// so a low request becomes normal after P and high after 2P. A request
// whose e would fall below 0 is overdue, from its deadline
// enqueued + (k+1)·P. The queue is ordered, at now, by:
//
//  1. overdue requests, by deadline (earliest first);
//  2. requests within the client's guarantee (the client's held tokens
//     plus the request's tokens at most its MinGuaranteed), by finish tag;
//  3. the others by effective class (high first), then by finish tag;
//
// ties broken by ID (arrival order). The order is a function of the state
// and now, so a store computes it on each call and keeps no index.
//
// # Granting
//
// Whenever tokens return (release, expiry, a use completing) and after a
// Reserve, the pool grants in order. It takes the first request of the
// order whose client's held tokens plus the request's are at most the
// client's MaxBurst (a client at its burst is skipped, and blocks no one).
// If the request's tokens are free it is granted, expiring at now + its
// duration, and the pool looks again; if not, granting stops. Stopping at
// a head that does not fit, rather than passing it to smaller requests
// behind it, keeps large requests from being starved by small ones, and
// keeps the returning tokens for a client below its guarantee.
//
// # The aging bound
//
// A request of class k enqueued at t is granted by
//
//	t + (k+1)·P + L·D
//
// where L is Config.QueueLimit and D is Config.MaxDuration, whatever load
// of higher priority arrives: a low request by t + 3P + L·D.
//
// Why: at its deadline d = t + (k+1)·P it is overdue, and from then on only
// overdue requests with an earlier deadline are ahead of it. A request
// arriving after d has a deadline of at least its arrival + P > d, so
// everything ever ahead of it was already queued at d: at most L - 1
// requests. Nothing behind it is granted while it waits, since granting
// stops at the first eligible request that does not fit. The tokens held
// at d are all back by d + D; the j-th request ahead, once granted, holds
// its tokens for at most D, so by the time it has been granted for D every
// token is back and the next one can be granted. Each takes at most D, and
// the request is granted by d + L·D.
//
// It is a worst case, with each request needing the whole pool for the
// longest duration; requests that release early or need part of the pool
// are served much sooner. It assumes the request's own client leaves it
// room under its MaxBurst: a client at its burst waits for its own
// tokens, which is its quota and not starvation. Expiry happens when a
// transition runs at or after ExpiresAt; if transitions (or Expire sweeps)
// run at least every g, each step can be late by g, and the bound is
// t + (k+1)·P + L·(D+g) + g. The property tests hold every queued request
// to that bound.
//
// Aging orders the requests of one class by age once they have waited
// longer than P, whatever their finish tags, so weighted fairness holds
// among requests that wait less than an aging period: choose P above the
// waits expected under normal load, and the queue limit to what the bound
// should be.
package reservation
