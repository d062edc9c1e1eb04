package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// Errors of Wait and WaitN. Test for them with errors.Is.
var (
	// ErrNeverAdmitted reports a request that no wait can admit: its cost
	// is negative or above the limit's burst (above the limit for the
	// window algorithms), or the limit denies everything.
	ErrNeverAdmitted = errors.New("sluice: the request can never be admitted")
	// ErrBeyondDeadline reports a request that would be admitted only
	// after its context's deadline. Nothing was reserved. It wraps
	// context.DeadlineExceeded.
	ErrBeyondDeadline = fmt.Errorf("sluice: the request would be admitted after the context's deadline: %w", context.DeadlineExceeded)
)

// maxReserveTries bounds the decisions of one reservation. Each decision
// after the first is made at the instant the previous one said the units
// would be back, and is denied only when other requests took them first:
// of k reservations racing for a key, at least one is made at each try,
// so k take at most k tries each.
const maxReserveTries = 100

// A Reservation holds units of a limit for one key, consumed at the
// instant they are back: the caller waits Delay, then acts. Reserve and
// ReserveN of Limiter and Redis return one. A Reservation does not change
// once made, and is safe for concurrent use.
//
// The units are consumed when the reservation is made, so there is no
// Cancel: Sluice's stores only consume (one atomic step that never gives
// back), and a refund made later, interleaved with other callers'
// requests, could admit more than the limit. A reservation not used is
// lost capacity, never excess. Wait reserves only when the wait ends
// before the context's deadline, so a Wait that fails on its deadline
// consumes nothing.
//
// What a reservation holds, by algorithm:
//
//   - GCRA (the algorithm of PerSecond, PerMinute and PerHour): exactly
//     the semantics of golang.org/x/time/rate's Reserve. The units are
//     taken at the instant they are back (the first decision's
//     RetryAfter), and every later request, from any process sharing the
//     state, queues behind them.
//   - Token bucket, leaky bucket: the same, to within a unit. Until the
//     reserved instant the bucket reads as it will be then, and a
//     reservation for the earliest instant leaves less than a unit there.
//     (On Redis the instant is aimed from the client's clock between two
//     calls, to within the difference of their one-way latencies.)
//   - Fixed window, sliding window counter and log: only units there now
//     are reserved; otherwise the Reservation is not OK. A window state
//     written ahead of time would count the present's requests against a
//     later window, and the log would drop entries that still count now:
//     either would admit beyond the limit. Wait still works on them: it
//     decides again each time the decision's RetryAfter has passed, so it
//     is not first come, first served.
type Reservation struct {
	ok      bool
	timeAct time.Time        // when the units may be used
	now     func() time.Time // the clock of Delay
}

// OK reports whether the units were reserved. A reservation is not OK when
// the request can never be admitted (see ErrNeverAdmitted), when the store
// could not answer, when the limit is a window algorithm whose units are
// not there now, or when other requests took the units first at every one
// of the instants it tried (a key contended far beyond its limit).
func (r *Reservation) OK() bool { return r.ok }

// Delay returns how long to wait, from now, before using the reserved
// units: 0 when they may be used at once. It is DelayFrom at the
// limiter's clock; a reservation that is not OK returns the largest
// Duration (math.MaxInt64), as golang.org/x/time/rate's does.
func (r *Reservation) Delay() time.Duration { return r.DelayFrom(r.now()) }

// DelayFrom returns how long to wait, from t, before using the reserved
// units: 0 when they may be used at t.
func (r *Reservation) DelayFrom(t time.Time) time.Duration {
	if !r.ok {
		return math.MaxInt64
	}
	return max(r.timeAct.Sub(t), 0)
}

// reserve decides a request with decide, ahead of time when it is denied
// and ahead is true, until it is admitted; it returns how far ahead, and
// the last decision. decide decides the request after ahead of the instant
// of the first decision. A request admitted only more than maxAfter ahead
// is not reserved (ErrBeyondDeadline); a request denied when ahead is
// false returns errNotNow.
func reserve(decide func(after time.Duration) (sluice.Decision, error), ahead bool, maxAfter time.Duration) (time.Duration, sluice.Decision, error) {
	var after time.Duration
	for range maxReserveTries {
		d, err := decide(after)
		switch {
		case err != nil:
			return 0, d, err
		case d.Allowed:
			return after, d, nil
		case d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0:
			return 0, d, ErrNeverAdmitted
		case d.RetryAfter > maxAfter-after:
			return 0, d, ErrBeyondDeadline
		case !ahead:
			return 0, d, errNotNow
		}
		after += d.RetryAfter
	}
	return 0, sluice.Decision{}, errContended
}

// Errors of a reservation that is not OK, though the request may be
// admitted later.
var (
	errContended = errors.New("sluice: the key's units were taken at every instant tried")
	errNotNow    = errors.New("sluice: a window algorithm reserves only the units there now")
)

// aheadOK reports whether reservations of algorithm a may be made ahead of
// time (see Reservation).
func aheadOK(a sluice.Algorithm) bool {
	return a == sluice.GCRA || a == sluice.TokenBucket || a == sluice.LeakyBucket
}

// maxWait returns how long after now the context's deadline is: the most a
// Wait may reserve ahead. A context without a deadline has no bound.
func maxWait(ctx context.Context, now time.Time) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return dl.Sub(now)
	}
	return math.MaxInt64
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reserve reserves one unit for key now, by the Config's clock; see
// ReserveN.
func (lim *Limiter) Reserve(key string) *Reservation {
	return lim.ReserveN(key, time.Time{}, 1)
}

// ReserveN reserves n units for key at t (zero means now, by the Config's
// clock) and returns the Reservation, whose Delay says when the caller may
// act: 0 when the units are there at t, otherwise the instant they will
// be back (see Reservation for what that means per algorithm). The units
// are consumed at once, whether the caller acts or not. A request that
// can never be admitted (negative n, n above the burst, a deny-all limit)
// returns a Reservation that is not OK and consumes nothing.
func (lim *Limiter) ReserveN(key string, t time.Time, n int64) *Reservation {
	r, _, _ := lim.reserve(key, t, n, math.MaxInt64)
	return r
}

// reserve is ReserveN, reserving at most maxAfter ahead of t; it also
// returns the last decision made.
func (lim *Limiter) reserve(key string, t time.Time, n int64, maxAfter time.Duration) (*Reservation, sluice.Decision, error) {
	if t.IsZero() {
		t = lim.now()
	}
	after, d, err := reserve(func(after time.Duration) (sluice.Decision, error) {
		if n < 0 {
			return lim.DecideAt(key, t, n), nil
		}
		return lim.store.Decide(store.Request{Key: key, Params: &lim.params, Cost: n, Now: t, After: after})
	}, aheadOK(lim.limit.Algorithm), maxAfter)
	return &Reservation{ok: err == nil, timeAct: t.Add(after), now: lim.now}, d, err
}

// Wait blocks until one unit for key is admitted; see WaitN.
func (lim *Limiter) Wait(ctx context.Context, key string) error {
	return lim.WaitN(ctx, key, 1)
}

// WaitN blocks until n units for key are admitted, and consumes them: it
// reserves them (ReserveN) and sleeps until they are back; on a window
// algorithm it sleeps until the units are back and decides again. It
// returns an error wrapping ErrNeverAdmitted when no wait can admit them,
// and ErrBeyondDeadline, consuming nothing, when they would be back only
// after ctx's deadline. When ctx is done during the sleep it returns
// ctx.Err(); reserved units stay consumed. The wait is measured on the
// Config's clock and slept on the real one.
func (lim *Limiter) WaitN(ctx context.Context, key string, n int64) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := lim.now()
		r, d, err := lim.reserve(key, now, n, maxWait(ctx, now))
		if errors.Is(err, errNotNow) {
			if err := sleep(ctx, d.RetryAfter); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("limiter: wait for %d units of %q: %w", n, key, err)
		}
		return sleep(ctx, r.DelayFrom(now))
	}
}

// Reserve reserves one unit for key now; see ReserveN.
func (lim *Redis) Reserve(ctx context.Context, key string) (*Reservation, error) {
	return lim.ReserveN(ctx, key, 1)
}

// ReserveN reserves n units for key now, by the Redis server's clock, and
// returns the Reservation, whose Delay says when the caller may act: 0
// when the units are there now, otherwise the instant they will be back
// (see Reservation for what that means per algorithm). The units are
// consumed now, in Redis, whether the caller acts or not. The first
// decision is one Lua script call, as Allow's; a reservation ahead of time
// takes one more (or a few, when other callers race for the same units),
// each one atomic step at the instant it reserves, so every process
// sharing the Redis sees the reservation. The delay is counted from when
// the answer arrives, so it errs long by the time the answer took.
//
// A Reservation that is not OK comes with an error saying why: one
// wrapping ErrNeverAdmitted when the request can never be admitted (then
// nothing is consumed), sluice.ErrStoreUnavailable when Redis cannot
// answer; see Reservation.OK for the others.
func (lim *Redis) ReserveN(ctx context.Context, key string, n int64) (*Reservation, error) {
	r, _, err := lim.reserve(ctx, key, n, math.MaxInt64)
	return r, err
}

// reserve is ReserveN, reserving at most maxAfter ahead; it also returns
// the last decision made.
func (lim *Redis) reserve(ctx context.Context, key string, n int64, maxAfter time.Duration) (*Reservation, sluice.Decision, error) {
	// The instants of reserve's decisions are offsets from the first
	// one's, at the Redis server's clock. A later call is decided at its
	// own server instant, which follows the first by about as much as
	// its sending follows the first's on the client's clock: its After is
	// the offset less that.
	var first, arrived time.Time
	var ahead time.Duration // the After of the last call
	_, d, err := reserve(func(after time.Duration) (sluice.Decision, error) {
		if n < 0 {
			return lim.DecideAt(ctx, key, time.Time{}, n)
		}
		sent := time.Now()
		if first.IsZero() {
			first = sent
		}
		since := sent.Sub(first)
		ahead = max(after-since, 0)
		var out [1]sluice.Decision
		req := [1]store.Request{{Key: key, Params: &lim.params, Cost: n, After: ahead}}
		err := lim.store.Check(ctx, req[:], out[:])
		arrived = time.Now()
		if !out[0].Allowed && out[0].RetryAfter > 0 {
			// Past the aimed instant already, the decision was at since:
			// its RetryAfter counts from there.
			out[0].RetryAfter += since + ahead - after
		}
		return out[0], err
	}, aheadOK(lim.limit.Algorithm), maxAfter)
	if err != nil {
		return &Reservation{now: time.Now}, d, fmt.Errorf("limiter: reserve %d units of %q: %w", n, key, err)
	}
	// The units are there ahead after the instant of the last call, which
	// is before its answer arrived.
	return &Reservation{ok: true, timeAct: arrived.Add(ahead), now: time.Now}, d, nil
}

// Wait blocks until one unit for key is admitted; see WaitN.
func (lim *Redis) Wait(ctx context.Context, key string) error {
	return lim.WaitN(ctx, key, 1)
}

// WaitN blocks until n units for key are admitted, and consumes them: it
// reserves them (ReserveN) and sleeps until they are back; on a window
// algorithm it sleeps until the units are back and decides again. It
// returns an error wrapping ErrNeverAdmitted when no wait can admit them,
// ErrBeyondDeadline, consuming nothing, when they would be back only after
// ctx's deadline, and sluice.ErrStoreUnavailable when Redis cannot answer.
// When ctx is done during the sleep it returns ctx.Err(); reserved units
// stay consumed.
func (lim *Redis) WaitN(ctx context.Context, key string, n int64) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, d, err := lim.reserve(ctx, key, n, maxWait(ctx, time.Now()))
		if errors.Is(err, errNotNow) {
			if err := sleep(ctx, d.RetryAfter); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		return sleep(ctx, r.Delay())
	}
}
