// Package sluice is the vocabulary of the Sluice rate limiter: the algorithms
// it implements, the limits a caller configures and the decisions a check
// returns.
//
// The state transitions of each algorithm live in package algorithm; the
// stores that keep their state (in process, Redis, Redis Cluster) live under
// store/. This package has no dependencies beyond the standard library.
package sluice

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate-limiting algorithm. The zero value is not a valid
// algorithm.
type Algorithm uint8

// The algorithms Sluice implements. Their semantics are defined in the
// documentation of package algorithm.
const (
	TokenBucket Algorithm = iota + 1
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	GCRA
)

var algorithmNames = [...]string{
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	GCRA:                 "gcra",
}

// Algorithms lists every algorithm in a stable order.
var Algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, GCRA}

// String returns the configuration name of a, such as "token_bucket".
func (a Algorithm) String() string {
	if a == 0 || int(a) >= len(algorithmNames) {
		return fmt.Sprintf("algorithm(%d)", uint8(a))
	}
	return algorithmNames[a]
}

// ParseAlgorithm returns the algorithm whose configuration name is s.
func ParseAlgorithm(s string) (Algorithm, error) {
	for _, a := range Algorithms {
		if algorithmNames[a] == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: %q (want one of token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter, gcra)", ErrUnknownAlgorithm, s)
}

// MaxWindow is the longest window or period a Limit may have.
const MaxWindow = 366 * 24 * time.Hour

// Limit configures one rate limit: at most Limit units of cost per Window,
// with bursts of up to Burst units for the algorithms that have a capacity
// (token bucket, leaky bucket, GCRA). A Limit is a plain value, safe to copy
// and to share between goroutines. The zero value is invalid; check a Limit
// with Validate, or compile it with algorithm.Compile, which validates it.
type Limit struct {
	// Algorithm decides how the limit is enforced.
	Algorithm Algorithm
	// Limit is the number of units of cost admitted per Window. It must be
	// at least 1 unless DenyAll is set.
	Limit int64
	// Window is the period over which Limit applies: the window of the
	// window algorithms, the time the bucket algorithms take to refill
	// Limit units. It must be positive, a whole number of microseconds and
	// at most MaxWindow.
	Window time.Duration
	// Burst is the capacity of token bucket, leaky bucket and GCRA: the
	// most units admitted at once after a long pause. Zero means Limit.
	// The window algorithms ignore it.
	Burst int64
	// DenyAll makes a limit that denies every request (Limit must be 0).
	DenyAll bool
}

// Validate reports whether l is a usable limit. Its errors wrap
// ErrInvalidLimit and name the offending field.
func (l Limit) Validate() error {
	switch {
	case l.Algorithm == 0 || int(l.Algorithm) >= len(algorithmNames):
		return fmt.Errorf("%w: algorithm: %w: %s", ErrInvalidLimit, ErrUnknownAlgorithm, l.Algorithm)
	case l.DenyAll:
		if l.Limit != 0 {
			return fmt.Errorf("%w: limit: a deny-all limit must have limit 0, got %d", ErrInvalidLimit, l.Limit)
		}
	case l.Limit <= 0:
		return fmt.Errorf("%w: limit: must be at least 1, got %d (use deny_all to refuse everything)", ErrInvalidLimit, l.Limit)
	case l.Limit > MaxLimit:
		return fmt.Errorf("%w: limit: %d is above the maximum %d", ErrInvalidLimit, l.Limit, int64(MaxLimit))
	}
	switch {
	case l.Window <= 0:
		return fmt.Errorf("%w: window: must be positive, got %s", ErrInvalidLimit, l.Window)
	case l.Window > MaxWindow:
		return fmt.Errorf("%w: window: %s is longer than a year", ErrInvalidLimit, l.Window)
	case l.Window%time.Microsecond != 0:
		return fmt.Errorf("%w: window: %s is not a whole number of microseconds", ErrInvalidLimit, l.Window)
	}
	if l.Burst < 0 {
		return fmt.Errorf("%w: burst: must be at least 1, got %d", ErrInvalidLimit, l.Burst)
	}
	if l.Burst > MaxLimit {
		return fmt.Errorf("%w: burst: %d is above the maximum %d", ErrInvalidLimit, l.Burst, int64(MaxLimit))
	}
	return nil
}

// Capacity returns the burst of l: Burst when it is set, Limit otherwise.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// MaxLimit is the largest Limit or Burst a limit may have (2^40, about 1.1e12).
const MaxLimit = 1 << 40

// Errors returned by Sluice. Test for them with errors.Is.
var (
	// ErrInvalidLimit is wrapped by every error about a badly configured limit.
	ErrInvalidLimit = errors.New("sluice: invalid limit")
	// ErrUnknownAlgorithm reports an algorithm name or value Sluice does not know.
	ErrUnknownAlgorithm = errors.New("sluice: unknown algorithm")
	// ErrInvalidCost reports a negative cost.
	ErrInvalidCost = errors.New("sluice: invalid cost")
	// ErrStoreUnavailable is wrapped by store errors that mean the store
	// could not answer: down, unreachable, or past the call's deadline.
	ErrStoreUnavailable = errors.New("sluice: store unavailable")
)
