// Package store states the contract that every storage back end of Sluice
// (store/memory, store/redis) fulfils, and the types they share: one
// interface, Store, which every store implements and every decorator (the
// guard of internal/guard, the engine's metrics) wraps once. What a store
// can do beyond the contract is stated as data, by Info, not found by type
// assertions. The conformance suite in store/storetest checks it.
//
// The contract:
//
//   - Every check of one key is one atomic step in the store: no two checks
//     of one key interleave, so a limit of L admits exactly L however many
//     callers race.
//   - Do decides a Batch's requests each on its own, or, when Batch.All is
//     set, as one unit: when any is denied, none consumes anything (exactly
//     so when all keys live on one node; see each store's docs for keys
//     spread over Redis Cluster slots).
//   - A request whose Now is zero is decided at the store's own clock (the
//     Redis server's TIME for Redis); a non-zero Now is used as given, for
//     replay and tests. Request.After moves either instant ahead.
//   - Every method honours its context's deadline and returns an error
//     wrapping sluice.ErrStoreUnavailable when the store cannot answer.
//     When it can answer for some of a Batch's requests and not for others
//     (a node of a cluster down, a batch that is not All), Do decides those
//     it can and says which it could not with a *PartialError.
//   - Implementations are safe for concurrent use; one Batch is used by one
//     call at a time.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Store is a storage back end of the limits' state, or a decorator of one.
// See the package doc for the contract.
type Store interface {
	// Do decides the requests of b and writes their decisions to b.Out,
	// as the fields of Batch say. It returns nil when every request was
	// decided; a *PartialError when some were and others not; any other
	// error when none was (and then nothing was consumed, except by a
	// call cut off after the store received it, which may have been).
	Do(ctx context.Context, b *Batch) error
	// Reset forgets the state of keys: their next check is decided as
	// the first. Keys the store does not hold are ignored.
	Reset(ctx context.Context, keys ...string) error
	// Info states what the store can do. It is fixed for the life of the
	// store, and cheap: callers may call it once and keep the answer.
	Info() Info
}

// Batch is one call of Store.Do: the requests in, the decisions out, and
// how they are decided. Callers may reuse a Batch (and its slices) from one
// call to the next; a store keeps none of it after Do returns.
type Batch struct {
	// Reqs are the requests, decided in order: a key that appears twice
	// is decided the second time on the state the first leaves.
	Reqs []Request
	// Out receives the decision of each request, Out[i] of Reqs[i]. It
	// must be at least as long as Reqs.
	Out []sluice.Decision
	// All decides Reqs as one unit: when any is denied none consumes
	// anything, and each request that would have been allowed is
	// reported denied with ReasonLimited and no retry-after. Otherwise
	// each is decided on its own.
	All bool
	// Once, when not nil, makes an All batch idempotent by Once.Key. Only
	// a store whose Info().SharedRecords is true honours it; others
	// ignore it (the caller keeps its records in process).
	Once *Once
	// Sources, when not nil (and as long as Reqs), receives what decided
	// each request. A store writes SourceStore; a decorator that answers
	// in process writes its own sources.
	Sources []Source
	// Part, when not nil, is told of each part of a batch that is not All
	// and has no Once as the part ends, when the store decides batches in
	// parts (Info().Parts): the indexes into Reqs decided (err nil, their
	// decisions in Out) or not decided (err, which wraps
	// sluice.ErrStoreUnavailable, says why). Every request is reported
	// once, before Do returns, by calls made one at a time on the
	// caller's goroutine, and Do then returns nil; when Do decides nothing
	// (an invalid request, a closed store) it reports nothing and returns
	// the error. Part must neither keep nor change idx. Stores that do
	// not decide in parts ignore Part.
	Part func(idx []int, err error)
}

// Once is the idempotency record of an all-or-nothing Batch. When Key has a
// record younger than TTL, nothing is decided or consumed, Batch.Out is
// filled with the recorded decisions and Replayed is set; otherwise the
// batch is decided as any All batch and its decisions recorded under Key for
// TTL (denials included: a repeat of a denied batch is denied again without
// being decided). The lookup, the decision and the record are one atomic
// step where the store can make them one (see each store's docs).
type Once struct {
	// Key names the record; the caller scopes it (client, counters).
	Key string
	// TTL is how long the record is kept; zero means the store's default.
	TTL time.Duration
	// Replayed is set by Do: true when the decisions came from a record.
	Replayed bool
}

// Source says what decided one request of a Batch.
type Source uint8

// The sources of a Batch's decisions.
const (
	SourceStore          Source = iota // the store decided
	SourceOverLimitCache               // a decorator's cached denial, no store call
	SourceHotKey                       // a decorator's in-process lease of a hot key
)

// Info states what a store can do, as data. The zero value is a store of one
// node that keeps no idempotency records, does not decide in parts and
// bounds no sliding window log.
type Info struct {
	// SharedRecords reports that the store keeps Batch.Once records for
	// every instance sharing it, so that a repeated check is charged once
	// across instances. When false, Do ignores Batch.Once.
	SharedRecords bool
	// Cluster reports that the store's keys are spread over several
	// nodes (a Redis Cluster), one of which may fail or stall while the
	// others answer.
	Cluster bool
	// Parts reports that Do decides batches in parts and reports them to
	// Batch.Part.
	Parts bool
	// MaxLogEntries is the largest limit of a sliding window log the store
	// can decide; zero means no bound.
	MaxLogEntries int64
	// MaxAtomicWork is the most work (see Work) of an all-or-nothing
	// Batch that the store decides in about a millisecond; zero means no
	// bound. A larger one holds the store for longer, and a Redis server
	// serves no other client meanwhile: callers should refuse such a
	// batch, or decide its requests each on its own, unless it holds one
	// request. Do decides it all the same.
	MaxAtomicWork int
}

// Work returns the work of r in a store call, in the units of
// Info.MaxAtomicWork: 1 for every algorithm but the sliding window log;
// for a log, 5 for the commands that read it plus the entries it may
// write: its cost, up to its limit and to 128. A unit is a few
// microseconds of a Redis server's time.
func Work(r *Request) int {
	if r.Params.Algorithm != sluice.SlidingWindowLog {
		return 1
	}
	return logReadWork + int(min(r.Cost, r.Params.Limit, maxEntryWork))
}

// The work of a sliding window log request (see Work).
const (
	logReadWork  = 5
	maxEntryWork = 128
)

// Accepts reports whether a store of Info i can decide requests with p: nil
// when it can, an error wrapping sluice.ErrInvalidLimit otherwise (see
// CheckParams).
func (i Info) Accepts(p *algorithm.Params) error {
	maxLog := i.MaxLogEntries
	if maxLog <= 0 {
		maxLog = math.MaxInt64
	}
	return CheckParams(p, maxLog)
}

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
	// After moves the instant of the check that far ahead of Now (or of
	// the store's clock): a request admitted After from now consumes its
	// cost at that instant, which is how a reservation holds units that
	// are not there yet. Until then, requests at earlier instants read the
	// key's state as at the later one, as after a clock that went back
	// (see package algorithm): exact for GCRA, whose state is an instant,
	// but a window algorithm would count them against the later window.
	// A store does not forget other keys' states on the strength of the
	// later instant. Zero, the usual case, decides at Now; a negative
	// After is read as zero.
	After time.Duration
}

// PartialError is returned by a Do whose requests were spread over
// several nodes (Redis Cluster) when some nodes answered and others did
// not. The requests at the indexes in Failed, ascending, were not decided;
// every other request was decided (and charged) and its decision is in
// Batch.Out. Err, which wraps sluice.ErrStoreUnavailable, says why the
// others failed. A Do that decides nothing returns Err alone. The failed
// parts travel in the error, not in the Batch, so that a caller that does
// not look for them treats the call as failed rather than as decided.
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
// above maxLog, which also wraps ErrLogTooLarge). Info.Accepts calls it.
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
