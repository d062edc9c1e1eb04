package reservation

import (
	"errors"
	"fmt"
)

// MaxExact bounds every integer of the state and of the arithmetic on it:
// 2^51, so that Redis' Lua computes the same values exactly in doubles.
const MaxExact = 1 << 51

// VirtualScale is the virtual time one token costs a client of weight 1.
// It is 720720, the least common multiple of 1 to 16, so that the virtual
// cost of a request is exact for those weights.
const VirtualScale = 720720

// rebaseAt is the virtual time past which every tag is shifted down.
const rebaseAt = 1 << 44

// Limits of the configuration, chosen so that tags and sums stay within
// MaxExact: a request costs at most MaxCapacity·VirtualScale < 2^45 of
// virtual time.
const (
	// MaxCapacity is the largest pool, in tokens.
	MaxCapacity = 1 << 24
	// MaxWeight is the largest weight of a client.
	MaxWeight = 1 << 16
	// MaxDuration is the longest reservation: 300 seconds, in microseconds.
	MaxDuration = 300_000_000
	// MaxQueueLimit is the longest queue a pool may have.
	MaxQueueLimit = 1 << 16
	// MaxQueueTokens bounds Capacity x QueueLimit, the tokens a full queue
	// can ask for: one client's backlog then costs at most 2^30 ·
	// VirtualScale < 2^50 of virtual time.
	MaxQueueTokens = 1 << 30
)

// Priority is the class of a request: High, Normal or Low. The zero value
// is no priority, which Reserve refuses, so that a request that forgot to
// say is not served as high.
type Priority int64

// The priorities, from the most urgent. A request of priority p is of
// class p - 1 (0, 1 or 2) in the order of the queue.
const (
	High   Priority = 1
	Normal Priority = 2
	Low    Priority = 3
)

// String returns "high", "normal" or "low".
func (p Priority) String() string {
	switch p {
	case High:
		return "high"
	case Normal:
		return "normal"
	case Low:
		return "low"
	}
	return fmt.Sprintf("Priority(%d)", int64(p))
}

// Errors of the transitions. A transition that returns an error leaves the
// state unchanged, but for the expiries it performs first (see Effects).
var (
	// ErrInvalid is wrapped by *InvalidError, the refusal of a bad request.
	ErrInvalid = errors.New("sluice: invalid reservation")
	// ErrQueueFull refuses a request when the pool's queue is at its limit.
	ErrQueueFull = errors.New("sluice: reservation queue full")
	// ErrNotFound is the answer for an ID that is not (or no longer) known:
	// never issued, cancelled, granted and expired.
	ErrNotFound = errors.New("sluice: reservation not found")
	// ErrInsufficient refuses a Use above the reservation's balance, or a
	// Complete above the tokens in use.
	ErrInsufficient = errors.New("sluice: reservation balance insufficient")
	// ErrNotQueued refuses the cancellation of a granted reservation.
	ErrNotQueued = errors.New("sluice: reservation not queued")
	// ErrNotGranted refuses Use, Complete and Release of a queued request.
	ErrNotGranted = errors.New("sluice: reservation not granted")
)

// InvalidError is the refusal of a request with a bad field. It wraps
// ErrInvalid.
type InvalidError struct {
	// Field names the field: "tokens", "duration", "priority", "client",
	// "n", or a Config field.
	Field string
	// Reason says what is wrong with it, for a person.
	Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalid, e.Field, e.Reason)
}

// Unwrap returns ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Quota is what a client is entitled to in a pool's queue.
type Quota struct {
	// Weight is the client's share under contention relative to the other
	// clients: 1 to MaxWeight; zero means 1.
	Weight int64
	// MinGuaranteed is the number of tokens the client's requests are
	// served ahead of others' up to (see the package documentation).
	// The guarantees of all clients sum to at most the capacity.
	MinGuaranteed int64
	// MaxBurst is the most tokens the client may hold at once; zero means
	// the capacity.
	MaxBurst int64
}

// Config is one pool's configuration. It is read, never changed, by the
// transitions, and safe to share once validated.
type Config struct {
	// Capacity is the pool's size in tokens, 1 to MaxCapacity.
	Capacity int64
	// QueueLimit is the most requests queued at once, 1 to MaxQueueLimit.
	QueueLimit int64
	// AgingPeriod is P in microseconds: a queued request's effective
	// priority rises one class every P. Positive.
	AgingPeriod int64
	// MaxDuration is the longest reservation in microseconds; zero means
	// (and at most) MaxDuration.
	MaxDuration int64
	// Default is the quota of a client not in Quotas.
	Default Quota
	// Quotas are the quotas of named clients.
	Quotas map[string]Quota
}

// Validate reports the first field of c that is out of range, as an
// *InvalidError.
func (c *Config) Validate() error {
	if c.Capacity < 1 || c.Capacity > MaxCapacity {
		return invalid("capacity", "%d not in [1, %d]", c.Capacity, MaxCapacity)
	}
	if c.QueueLimit < 1 || c.QueueLimit > MaxQueueLimit {
		return invalid("queue_limit", "%d not in [1, %d]", c.QueueLimit, MaxQueueLimit)
	}
	if c.Capacity*c.QueueLimit > MaxQueueTokens {
		return invalid("queue_limit", "capacity x queue limit %d above %d", c.Capacity*c.QueueLimit, MaxQueueTokens)
	}
	if c.AgingPeriod <= 0 || c.AgingPeriod > MaxExact/4 {
		return invalid("aging_period", "%dµs not positive", c.AgingPeriod)
	}
	if c.MaxDuration < 0 || c.MaxDuration > MaxDuration {
		return invalid("max_duration", "%dµs not in [0, %dµs]", c.MaxDuration, int64(MaxDuration))
	}
	if err := c.validQuota("default", c.Default); err != nil {
		return err
	}
	sum := int64(0)
	for name, q := range c.Quotas {
		if err := c.validQuota(name, q); err != nil {
			return err
		}
		sum += q.MinGuaranteed
	}
	if sum > c.Capacity {
		return invalid("fairness_quotas", "guarantees sum to %d, above the capacity %d", sum, c.Capacity)
	}
	return nil
}

func (c *Config) validQuota(name string, q Quota) error {
	if q.Weight < 0 || q.Weight > MaxWeight {
		return invalid("fairness_quotas", "%s: weight %d not in [1, %d]", name, q.Weight, MaxWeight)
	}
	if q.MaxBurst < 0 || q.MaxBurst > c.Capacity {
		return invalid("fairness_quotas", "%s: max_burst %d not in [1, capacity]", name, q.MaxBurst)
	}
	if q.MinGuaranteed < 0 || q.MinGuaranteed > c.burst(q) {
		return invalid("fairness_quotas", "%s: min_guaranteed %d not in [0, max_burst]", name, q.MinGuaranteed)
	}
	return nil
}

// quota returns the client's quota, its zero fields filled in.
func (c *Config) quota(client string) Quota {
	q, ok := c.Quotas[client]
	if !ok {
		q = c.Default
	}
	q.Weight = max(q.Weight, 1)
	q.MaxBurst = c.burst(q)
	return q
}

func (c *Config) burst(q Quota) int64 {
	if q.MaxBurst == 0 {
		return c.Capacity
	}
	return q.MaxBurst
}

func (c *Config) maxDuration() int64 {
	if c.MaxDuration == 0 {
		return MaxDuration
	}
	return c.MaxDuration
}

// State is one pool's state. Its zero value is a pool never used. The
// transitions change it in place; a store holds it, or mirrors it, and
// makes each transition atomic. It is not safe for concurrent use.
type State struct {
	// Held is the number of tokens granted and not returned.
	Held int64
	// Virtual is the virtual time V of the fair queue.
	Virtual int64
	// LastID is the last ID issued; IDs start at 1.
	LastID int64
	// Clients holds the clients with a request queued, tokens held, or a
	// finish tag ahead of Virtual; the others are as if never seen.
	Clients map[string]Client
	// Queue holds the requests waiting, in arrival order (the order in
	// which they are served is computed at each call).
	Queue []Request
	// Granted holds the reservations granted and not yet expired.
	Granted []Reservation
}

// Client is the state of one client of a pool.
type Client struct {
	// Finish is the finish tag of the client's last request.
	Finish int64
	// Held is the number of tokens the client holds: the sum of its
	// reservations' Balance + InUse.
	Held int64
	// Queued is the number of its requests in the queue.
	Queued int64
}

// Request is a queued request: what Reserve was asked, and its tags.
type Request struct {
	// ID is the request's ID, kept when it is granted.
	ID int64
	// Client names the client that asked.
	Client string
	// Tokens is the number of tokens asked for.
	Tokens int64
	// Duration is how long the reservation lasts once granted, in µs.
	Duration int64
	// Priority is the class it was asked at; its effective class rises
	// as it waits.
	Priority Priority
	// Enqueued is the instant it was queued, in µs since the epoch.
	Enqueued int64
	// Start and Finish are the request's virtual start and finish tags.
	Start, Finish int64
}

// Reservation is a granted reservation. It holds Balance + InUse tokens.
type Reservation struct {
	// ID is the ID Reserve returned.
	ID int64
	// Client names the client that holds it.
	Client string
	// Tokens is the number of tokens granted.
	Tokens int64
	// Balance is the part of the tokens neither used nor released.
	Balance int64
	// InUse is the part drawn by Use and not yet completed.
	InUse int64
	// GrantedAt and ExpiresAt are the instants of the grant and of the
	// expiry, in µs since the epoch.
	GrantedAt, ExpiresAt int64
	// Released is set by the first Release.
	Released bool
}

// Ask is a request for a reservation.
type Ask struct {
	// Client names the client asking; not empty.
	Client string
	// Tokens is the number of tokens asked for: positive, at most the
	// capacity and the client's MaxBurst.
	Tokens int64
	// Duration is how long the reservation lasts once granted, in µs:
	// positive, at most the pool's MaxDuration.
	Duration int64
	// Priority is High, Normal or Low.
	Priority Priority
}

// Result is the outcome of a Reserve that was not refused.
type Result struct {
	// ID identifies the reservation for Use, Complete, Release and Cancel.
	ID int64
	// Granted reports whether the tokens were granted at once.
	Granted bool
	// Position is 0 when granted, else the request's place in the queue's
	// order at now, 1 for the head.
	Position int64
	// ExpiresAt is the instant the grant expires, when granted.
	ExpiresAt int64
	// EstimatedAt is, when queued, the instant at which the request would
	// be granted if every reservation were held to its expiry, the
	// requests ahead took their full durations and nothing arrived ahead
	// of it: an upper estimate under that load.
	EstimatedAt int64
}

// Grant is a queued request granted by a transition, which a store tells
// the client that waits for it.
type Grant struct {
	ID     int64
	Client string
	Tokens int64
	// ExpiresAt is the instant the grant expires, in µs since the epoch.
	ExpiresAt int64
}

// Expiry is a reservation that expired, and the tokens it returned (its
// balance and the tokens still in use).
type Expiry struct {
	ID       int64
	Client   string
	Returned int64
}

// Effects is what a transition did besides its own result: the
// reservations it expired first and the queued requests it granted, in
// the order of the grants. The zero value is nothing done.
type Effects struct {
	Expired []Expiry
	Granted []Grant
}
