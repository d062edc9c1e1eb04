package reserve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/reservation"
)

// Backend keeps the pools and runs each operation on a pool as one atomic
// step: the transitions of package reservation, and the bookkeeping of
// the public IDs (secret, holder, released). Memory keeps them in
// process for one instance; package redispool keeps them in Redis, where
// every instance sharing the Redis sees them.
//
// A pool is named by its handle (PoolHandle); a reservation within it by
// its secret, which the Keeper draws. Instants are in µs since the epoch;
// a zero now means the backend's own clock (for Redis, the server's, which
// every instance shares). The client argument of Get, Use and Release,
// when not empty, must be the holder's, else ErrForbidden; the lookups
// (unknown ID, another holder, released) change nothing, so they report
// no effects. Use, Release and Get of a released reservation are
// reservation.ErrNotFound.
//
// Every method reports, beside its result, the Effects of the operation:
// the reservations it expired, released and granted from the queue, in
// order, for the Keeper to record as events. Implementations are safe
// for concurrent use; errors of the backend itself (Redis unreachable)
// wrap sluice.ErrStoreUnavailable.
type Backend interface {
	// Reserve runs reservation.Reserve on pool p, whose configuration
	// it takes first when it differs; the reservation is known by secret
	// from then on.
	Reserve(ctx context.Context, p *Pool, now int64, a reservation.Ask, secret string) (reservation.Result, []Effect, error)
	// Get expires what is due in the pool of handle and returns the
	// record of secret, with its place in the queue when queued.
	Get(ctx context.Context, handle, secret, client string, now int64) (Record, []Effect, error)
	// Use draws n tokens from the balance of secret (reservation.Use);
	// n = 0 only expires what is due. It is reservation.ErrNotGranted
	// while the request is queued.
	Use(ctx context.Context, handle, secret, client string, now, n int64) (Record, []Effect, error)
	// Release cancels secret when queued (reservation.Cancel), or
	// releases it when granted (reservation.Release).
	Release(ctx context.Context, handle, secret, client string, now int64) (Ended, []Effect, error)
	// Sweep expires what is due in every pool, grants from their queues,
	// and forgets the pools left idle.
	Sweep(ctx context.Context, now int64) ([]Effect, error)
	// Peek returns the tokens held in the pool of handle and its
	// capacity (0, 0 without a pool) and, when client is not empty, the
	// place in the queue at now of client's first request queued, and the
	// estimate of its grant (position 0 when it has none). It changes
	// nothing.
	Peek(ctx context.Context, handle, client string, now int64) (Peeked, error)
}

// Pool names a pool and gives its configuration.
type Pool struct {
	// Handle is PoolHandle(Rule, Resource).
	Handle string
	// Rule is the rule whose limit makes the pool; Resource the resource.
	Rule, Resource string
	// Config is the pool's configuration, validated.
	Config reservation.Config
}

// PoolHandle returns the handle of the pool of (rule, resource): 16 hex
// digits of their SHA-256, the same on every instance, so that a
// reservation's ID names its pool wherever it is presented.
func PoolHandle(rule, resource string) string {
	h := sha256.New()
	h.Write([]byte(rule))
	h.Write([]byte{0})
	h.Write([]byte(resource))
	return hex.EncodeToString(h.Sum(nil)[:handleLen/2])
}

// Record is what a backend returns of one reservation.
type Record struct {
	// Client is the holder; Rule and Resource name the pool.
	Client, Rule, Resource string
	// Queued is set while the request waits; Position (1 for the head)
	// and EstimatedAt are then its place and the estimate of its grant.
	Queued                bool
	Position, EstimatedAt int64
	// Tokens is the number asked for; Balance and InUse the parts of a
	// granted reservation not used and used (reservation.Reservation).
	Tokens, Balance, InUse int64
	// GrantedAt and ExpiresAt are set once granted.
	GrantedAt, ExpiresAt int64
}

// Effect is a reservation expired, released or granted by an operation.
type Effect struct {
	// Type is events.ReservationExpired, ReservationReleased or
	// ReservationGranted.
	Type events.Type
	// Secret names the reservation in its pool.
	Secret string
	// Client is the holder; Rule and Resource name the pool.
	Client, Rule, Resource string
	// Tokens is what was returned (expired, released) or granted.
	Tokens int64
	// ExpiresAt is, for a grant, when it expires (µs since the epoch).
	ExpiresAt int64
}

// Peeked is the answer of Backend.Peek.
type Peeked struct {
	Held, Capacity        int64
	Position, EstimatedAt int64
}
