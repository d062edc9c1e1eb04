// Package store states the contract that every storage back end of Sluice
// (store/memory, store/redis) fulfils, and the types they share. The
// conformance suite in store/storetest checks it.
//
// The contract:
//
//   - Every check of one key is one atomic step in the store: no two checks
//     of one key interleave, so a limit of L admits exactly L however many
//     callers race.
//   - Check decides each request independently. CheckAll decides its
//     requests as one unit: when any is denied, none consumes anything
//     (exactly so when all keys live on one node; see each store's docs for
//     keys spread over Redis Cluster slots).
//   - A request whose Now is zero is decided at the store's own clock (the
//     Redis server's TIME for Redis); a non-zero Now is used as given, for
//     replay and tests.
//   - Every method honours its context's deadline and returns an error
//     wrapping sluice.ErrStoreUnavailable when the store cannot answer.
//     When it can answer for some of Check's requests and not for others
//     (a node of a cluster down), Check decides those it can and says
//     which it could not with a *PartialError.
//   - Implementations are safe for concurrent use.
package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Request is one check of one limit against a store.
type Request struct {
	// Key identifies the state; requests with equal keys share it. The
	// caller must use one Params (one algorithm) per key.
	Key string
	// Params is the compiled limit. It must not be modified.
	Params *algorithm.Params
	// Cost is the number of units to consume; 0 reads without consuming.
	Cost int64
	// Now is the instant of the check; zero means the store's clock.
	Now time.Time
}

// PartialError is returned by a Check whose requests were spread over
// several nodes (Redis Cluster) when some nodes answered and others did
// not. The requests at the indexes in Failed, ascending, were not decided;
// every other request was decided (and charged) and its decision is in
// out. Err, which wraps sluice.ErrStoreUnavailable, says why the others
// failed. A Check that decides nothing returns Err alone.
type PartialError struct {
	Failed []int
	Err    error
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("%v (%d requests not decided)", e.Err, len(e.Failed))
}

func (e *PartialError) Unwrap() error { return e.Err }

// ErrReplied is wrapped, with sluice.ErrStoreUnavailable, by the errors of
// a store whose server answered with an error (a Redis error reply): the
// store did not decide, but it is reachable and answering, which tells a
// busy store from one that is down.
var ErrReplied = errors.New("sluice: the store answered with an error")

// ErrLogTooLarge reports a sliding window log whose limit is above a store's
// maximum number of log entries per key. Errors wrapping it also wrap
// sluice.ErrInvalidLimit.
var ErrLogTooLarge = errors.New("sluice: sliding window log too large for the store")

// CheckParams reports whether a store whose sliding window logs hold at most
// maxLog entries per key can decide requests with p: nil when it can, an
// error wrapping sluice.ErrInvalidLimit otherwise (no params, an unknown
// algorithm, params not made by algorithm.Compile, or a sliding window log
// above maxLog, which also wraps ErrLogTooLarge). Stores call it from their
// Accepts method.
func CheckParams(p *algorithm.Params, maxLog int64) error {
	switch {
	case p == nil:
		return fmt.Errorf("%w: no params", sluice.ErrInvalidLimit)
	case p.Algorithm == 0 || p.Algorithm > sluice.GCRA:
		return fmt.Errorf("%w: algorithm: %w: %s", sluice.ErrInvalidLimit, sluice.ErrUnknownAlgorithm, p.Algorithm)
	case p.Algorithm == sluice.SlidingWindowLog && p.Limit > maxLog:
		return fmt.Errorf("%w: %w: limit %d is above the store's maximum of %d log entries per key; use sliding_window_counter, which needs constant memory, or raise MaxLogEntries",
			sluice.ErrInvalidLimit, ErrLogTooLarge, p.Limit, maxLog)
	case p.Window <= 0 || p.Quantum <= 0:
		return fmt.Errorf("%w: params not compiled (window %d, quantum %d)", sluice.ErrInvalidLimit, p.Window, p.Quantum)
	}
	return nil
}
