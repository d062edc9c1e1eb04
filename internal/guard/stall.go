package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// Defaults of the stall detection (see Config.StallTimeout).
const (
	// DefaultStallFloor is the least stall timeout learned from the
	// store's latency.
	DefaultStallFloor = time.Second
	// stallFactor multiplies the slowest recent answer into the learned
	// stall timeout.
	stallFactor = 4
	// latencyEpoch is how long the slowest answer is remembered: between
	// one and two epochs.
	latencyEpoch = 10 * time.Second
)

// fallbackError is an error of the guard that says why a check was not
// decided by the store: the engine reads the reason (store.FallbackOf)
// for its metrics, its answers and its events.
type fallbackError struct {
	msg    string
	reason store.Fallback
}

func (e *fallbackError) Error() string { return e.msg }

// Fallback returns why the store did not decide.
func (e *fallbackError) Fallback() store.Fallback { return e.reason }

// ErrStalled is wrapped (with sluice.ErrStoreUnavailable) by the error of
// a call given up because the store answered nothing, to any call, for
// the stall timeout (see Config.StallTimeout).
var ErrStalled error = &fallbackError{"sluice: store stalled: no answer to any call within the stall timeout", store.FallbackStalled}

// ErrDeadline is wrapped (with sluice.ErrStoreUnavailable and
// context.DeadlineExceeded) by the error of a call given up at the
// guard's deadline while the store kept answering other calls: the store
// is busy, not down.
var ErrDeadline error = &fallbackError{"sluice: store deadline passed", store.FallbackDeadline}

// stallDetector tells a store that answers slowly (busy) from one that
// does not answer at all (stalled: paused, a network that drops packets).
// It remembers when the store last answered any call, and the slowest
// answer of the last one to two latencyEpochs. It counts the store's
// silence on its heartbeat's awake clock, so that time the process itself
// could not run (it would have read the answers late) is not taken for
// the store's. It is safe for concurrent use; races between concurrent
// updates only lose an update of the same instant.
type stallDetector struct {
	fixed    time.Duration // Config.StallTimeout: > 0 fixed, < 0 off, 0 learned
	deadline time.Duration // the learned timeout never exceeds it
	beat     heartbeat

	last  atomic.Int64 // awake ns of the latest answer, 0 before any
	epoch atomic.Int64 // Unix ns at which the current epoch began
	cur   atomic.Int64 // slowest answer of the current epoch, ns
	prev  atomic.Int64 // slowest answer of the previous epoch, ns

	// tripped is when a call last gave up because the store stalled, and
	// probe when a call was last let through to the stalled store (awake
	// ns).
	tripped atomic.Int64
	probe   atomic.Int64
}

// clock returns t, now or a moment ago, on the awake clock (see
// heartbeat.awake): the instant from which a call starting at t counts the
// store's silence.
func (s *stallDetector) clock(t time.Time) int64 { return s.beat.awake(t) }

// trip records that a call gave up at now because the store stalled.
func (s *stallDetector) trip(now time.Time) { s.tripped.Store(s.clock(now)) }

// blocked reports whether a call starting at now should fail at once:
// a call gave up because the store stalled, and the store has answered
// nothing since. One call per timeout is let through, to see whether the
// store is back (the calls still in flight see it too).
func (s *stallDetector) blocked(now time.Time, timeout time.Duration) bool {
	tr := s.tripped.Load()
	if timeout == 0 || tr == 0 || tr <= s.last.Load() {
		return false
	}
	p, n := s.probe.Load(), s.clock(now)
	return n-p < int64(timeout) || !s.probe.CompareAndSwap(p, n)
}

// answered records an answer of the store to a call sent at sent,
// received at now.
func (s *stallDetector) answered(sent, now time.Time) {
	if a := s.clock(now); a > s.last.Load() {
		s.last.Store(a)
	}
	n := now.UnixNano()
	lat := n - sent.UnixNano()
	if e := s.epoch.Load(); n-e >= int64(latencyEpoch) && s.epoch.CompareAndSwap(e, n) {
		s.prev.Store(s.cur.Swap(lat))
		return
	}
	for {
		c := s.cur.Load()
		if lat <= c || s.cur.CompareAndSwap(c, lat) {
			return
		}
	}
}

// timeout returns the stall timeout in force, 0 when stall detection is
// off or could not end a call before its deadline.
func (s *stallDetector) timeout() time.Duration {
	t := s.fixed
	switch {
	case t < 0:
		return 0
	case t == 0:
		t = max(DefaultStallFloor, stallFactor*time.Duration(max(s.cur.Load(), s.prev.Load())))
	}
	if t >= s.deadline {
		return 0
	}
	return t
}

// stalled reports whether a call that started at since (on the awake
// clock, see clock), waiting at now, should give up: the store answered
// nothing since max(since, its latest answer) for at least timeout (0:
// never), on the awake clock. An idle period before the call is not a
// stall, which is why the wait counts from the call's start; nor is the
// time before the store's first answer (a store that never answered has
// not stopped: its first calls connect and load scripts); nor is time the
// process could not run.
func (s *stallDetector) stalled(since int64, now time.Time, timeout time.Duration) bool {
	last := s.last.Load()
	return timeout > 0 && last != 0 && s.clock(now)-max(since, last) >= int64(timeout)
}

// wakeIn returns how long after now a call that started at since (on the
// awake clock) should look again whether the store stalled: the rest of
// the timeout on the awake clock, which is at least as long on the wall
// clock.
func (s *stallDetector) wakeIn(since int64, now time.Time, timeout time.Duration) time.Duration {
	return time.Duration(max(since, s.last.Load()) + int64(timeout) - s.clock(now))
}

// isAnswer reports whether a store call that ended with err was answered
// by the store: a decision, an error about the request, an error reply
// of the server (store.ErrReplied), or a call of which some parts were
// answered. A failure to reach the store (refused, reset, closed, past
// its context) is not an answer.
func isAnswer(err error) bool {
	if err == nil || !errors.Is(err, sluice.ErrStoreUnavailable) || errors.Is(err, store.ErrReplied) {
		return true
	}
	var partial *store.PartialError
	return errors.As(err, &partial)
}

// noteAnswer records the end of a store call sent at sent, when the store
// answered it.
func (g *Guard) noteAnswer(sent time.Time, err error) {
	if isAnswer(err) {
		g.stall.answered(sent, time.Now())
	}
}

// gaveUp returns the error of a call whose caller stopped waiting: its
// context ended, the store stalled, or the guard's deadline passed while
// the store answered other calls. When the call was sent (the store may
// have received it and counted it), the error wraps ErrMaybeCounted too.
func (g *Guard) gaveUp(ctx context.Context, stalled, sent bool) error {
	var err error
	switch {
	case ctx.Err() != nil:
		err = fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, ctx.Err())
	case stalled:
		err = fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, ErrStalled)
	default:
		err = fmt.Errorf("%w: %w: %w", sluice.ErrStoreUnavailable, ErrDeadline, context.DeadlineExceeded)
	}
	if sent {
		err = fmt.Errorf("%w: %w", err, ErrMaybeCounted)
	}
	return err
}
