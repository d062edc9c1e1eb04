package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice"
)

// BreakerState is the state of the circuit breaker.
type BreakerState uint8

// The breaker states.
const (
	// BreakerClosed: calls go to the store.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: up to BreakerConfig.Probes calls go to the store
	// to see whether it is back; the others fail at once.
	BreakerHalfOpen
	// BreakerOpen: every call fails at once, with no network call.
	BreakerOpen
)

var breakerStateNames = [...]string{BreakerClosed: "closed", BreakerHalfOpen: "half_open", BreakerOpen: "open"}

// String returns "closed", "half_open" or "open".
func (s BreakerState) String() string {
	if int(s) < len(breakerStateNames) {
		return breakerStateNames[s]
	}
	return "unknown"
}

// Defaults of BreakerConfig.
const (
	DefaultBreakerWindow       = 2 * time.Second
	DefaultBreakerMinRequests  = 20
	DefaultBreakerFailureRatio = 0.5
	DefaultBreakerOpenTimeout  = 500 * time.Millisecond
	DefaultBreakerProbes       = 3
	DefaultBreakerSustain      = 250 * time.Millisecond
)

// BreakerConfig configures the circuit breaker. The zero value is the
// defaults: it opens when at least half of at least 20 store calls over
// the last 2 seconds failed (so about one second into a complete outage
// under steady traffic), stays open 500 ms, then lets 3 probe calls
// through and closes after 3 consecutive successes.
//
// A failure is an error wrapping sluice.ErrStoreUnavailable (the store is
// down, unreachable, or did not answer within the deadline). Errors about
// the request itself count as successes. Calls cancelled by their caller,
// or cut short by a caller's own deadline that came before the store
// deadline, are not counted: a caller's haste says nothing of the store.
type BreakerConfig struct {
	// Disabled turns the breaker off: every call goes to the store.
	Disabled bool
	// Window is the rolling window over which the failure ratio is
	// measured, in ten buckets; zero means DefaultBreakerWindow.
	Window time.Duration
	// MinRequests is the number of calls the window must hold before the
	// breaker may open, the calls that are not counted (see above) left
	// out; zero means DefaultBreakerMinRequests.
	MinRequests uint32
	// FailureRatio is the share of failed calls in the window at or
	// above which the breaker opens, in (0, 1]; zero means
	// DefaultBreakerFailureRatio.
	FailureRatio float64
	// OpenTimeout is how long the breaker stays open before it lets probe
	// calls through; zero means DefaultBreakerOpenTimeout.
	OpenTimeout time.Duration
	// Probes is both the number of calls let through while half-open and
	// the number of consecutive successes that close the breaker; zero
	// means DefaultBreakerProbes. One failure while half-open opens it
	// again.
	Probes uint32
	// Sustain is how long the failure ratio must hold, from the first
	// failure that met it, before the breaker opens: a stall of the server
	// itself (a collection, a burst at a cold start) fails the calls in
	// flight at once, and must not take the store out of service for a
	// whole OpenTimeout. Zero means DefaultBreakerSustain; negative opens
	// at the first failure that meets the ratio.
	Sustain time.Duration
}

// settings returns the gobreaker settings of c, nil when disabled.
func (c BreakerConfig) settings() (*gobreaker.Settings, error) {
	if c.Disabled {
		return nil, nil
	}
	if c.Window < 0 || c.OpenTimeout < 0 {
		return nil, errors.New("guard: config: breaker window and open timeout must not be negative")
	}
	if !(c.FailureRatio >= 0 && c.FailureRatio <= 1) { // NaN too
		return nil, fmt.Errorf("guard: config: breaker failure ratio must be in (0, 1], got %v", c.FailureRatio)
	}
	if c.Window == 0 {
		c.Window = DefaultBreakerWindow
	}
	if c.MinRequests == 0 {
		c.MinRequests = DefaultBreakerMinRequests
	}
	if c.FailureRatio == 0 {
		c.FailureRatio = DefaultBreakerFailureRatio
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = DefaultBreakerOpenTimeout
	}
	if c.Probes == 0 {
		c.Probes = DefaultBreakerProbes
	}
	bucket := c.Window / 10
	if bucket <= 0 {
		bucket = c.Window
	}
	if c.Sustain == 0 {
		c.Sustain = DefaultBreakerSustain
	}
	minReq, ratio, sustain := c.MinRequests, c.FailureRatio, c.Sustain
	var since time.Time // when the counts began to meet the ratio; zero when they do not
	return &gobreaker.Settings{
		Name:         "store",
		MaxRequests:  c.Probes,
		Interval:     c.Window,
		BucketPeriod: bucket,
		Timeout:      c.OpenTimeout,
		// gobreaker calls ReadyToTrip on each failure while closed, with
		// its lock held, so since needs no lock of its own. Its Requests
		// include the excluded calls (cancelled by their callers, or never
		// sent), which must neither lower the ratio nor count toward
		// MinRequests.
		ReadyToTrip: func(n gobreaker.Counts) bool {
			counted := n.Requests - min(n.Requests, n.TotalExclusions)
			if counted < minReq || float64(n.TotalFailures) < ratio*float64(counted) {
				since = time.Time{}
				return false
			}
			if sustain < 0 {
				return true
			}
			now := time.Now()
			if since.IsZero() {
				since = now
			}
			if now.Sub(since) < sustain {
				return false
			}
			since = time.Time{}
			return true
		},
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerGone) || errors.Is(err, errNotSent) },
	}, nil
}

func fromGobreaker(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// BreakerState returns the breaker's state; BreakerClosed when the
// breaker is off.
func (g *Guard) BreakerState() BreakerState {
	if g.cb == nil {
		return BreakerClosed
	}
	return fromGobreaker(g.cb.State())
}

// stateChanged is the breaker's OnStateChange. gobreaker calls it with its
// mutex held: it must not call back into the breaker.
func (g *Guard) stateChanged(_ string, from, to gobreaker.State) {
	now := time.Now()
	g.mu.Lock()
	switch to {
	case gobreaker.StateOpen:
		g.stats.opened.Add(1)
		g.lastOpened = now
	case gobreaker.StateClosed:
		g.stats.closed.Add(1)
		g.lastClosed = now
	}
	g.mu.Unlock()
	g.obs.BreakerChanged(fromGobreaker(to))
	if g.onChange != nil {
		g.onChange(fromGobreaker(from), fromGobreaker(to))
	}
}

// errCallerGone marks, for the breaker, a call cut short by its caller:
// cancelled, or past the caller's own deadline when it came before the
// store deadline.
var errCallerGone = errors.New("guard: caller gone")

// errNotSent marks, for the breaker, a check whose deadline passed while
// it waited for a gathered call: the server's own congestion, which says
// nothing of the store's health.
var errNotSent = errors.New("guard: deadline passed before the call was sent")

// breakerOutcome returns what the breaker is told of a call that ended
// with err: nil (a success) for an answer or an error about the request
// itself; errCallerGone when the caller cancelled, or when the call ran
// out of time at the caller's own deadline (callerFirst: it came before
// the store deadline), which says nothing of a store that may answer
// within the store deadline; err otherwise.
func breakerOutcome(ctx context.Context, err error, callerFirst bool) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		return errCallerGone
	case callerFirst && errors.Is(err, context.DeadlineExceeded):
		return errCallerGone
	case errors.Is(err, sluice.ErrStoreUnavailable):
		return err
	}
	return nil
}
