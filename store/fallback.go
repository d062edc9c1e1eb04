package store

import (
	"context"
	"errors"
)

// Fallback says why a request was decided without the store: a decorator
// that gives up on a call (the guard of internal/guard) says why with an
// error that has a Fallback() Fallback method, and the engine then decides
// by the rule's failure mode. The zero value, FallbackNone, is a decision
// that did not fall back.
type Fallback uint8

// The reasons of a fallback. Their String values appear in API
// responses, the sluice_store_fallbacks_total metric and events.
const (
	FallbackNone        Fallback = iota
	FallbackUnreachable          // the store refused or lost the connection, or failed
	FallbackStalled              // the store answered no call for the stall timeout
	FallbackDeadline             // the store answered other calls but not this one by the deadline
	FallbackBreakerOpen          // the circuit breaker is open: no call was made
	FallbackOverloaded           // too many store calls in flight: no call was made
)

var fallbackNames = [...]string{
	FallbackNone:        "",
	FallbackUnreachable: "unreachable",
	FallbackStalled:     "stalled",
	FallbackDeadline:    "deadline",
	FallbackBreakerOpen: "breaker_open",
	FallbackOverloaded:  "overloaded",
}

// Fallbacks lists the reasons of a fallback, FallbackNone left out.
var Fallbacks = []Fallback{FallbackUnreachable, FallbackStalled, FallbackDeadline, FallbackBreakerOpen, FallbackOverloaded}

// String returns the wire name of f, such as "stalled"; "" for
// FallbackNone.
func (f Fallback) String() string {
	if int(f) < len(fallbackNames) {
		return fallbackNames[f]
	}
	return "unknown"
}

// FallbackOf returns why a store call that failed with err did not
// decide: the reason carried by err (an error with a
// Fallback() Fallback method in its chain, as the guard's are),
// FallbackDeadline for a context's deadline, FallbackUnreachable
// otherwise; FallbackNone for a nil err.
func FallbackOf(err error) Fallback {
	if err == nil {
		return FallbackNone
	}
	var r interface{ Fallback() Fallback }
	if errors.As(err, &r) {
		return r.Fallback()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return FallbackDeadline
	}
	return FallbackUnreachable
}

// ErrMaybeCounted is wrapped by the error of a call given up on after it
// was sent (at a deadline, on a stall, or because its caller went away):
// the store may have received it and may count it (a paused server runs
// what it read once it resumes). A check whose call failed so must not be
// admitted without the store too: the service's engine fails its local
// rules closed. A call given up on before it was sent, or that could not reach
// the store (refused, reset, an open breaker), does not wrap it: nothing
// was counted.
var ErrMaybeCounted = errors.New("sluice: the store may have counted the call")
