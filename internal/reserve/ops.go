package reserve

import (
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/reservation"
)

// Ask is a request for a reservation.
type Ask struct {
	// Client and Resource say who reserves, and from which pool.
	Client, Resource string
	// Tokens is the number of tokens asked for.
	Tokens int64
	// Duration is how long the reservation lasts once granted: positive,
	// at most 300 s, in whole microseconds.
	Duration time.Duration
	// Priority is reservation.High, Normal or Low.
	Priority reservation.Priority
}

// Result is the outcome of Reserve.
type Result struct {
	// ID identifies the reservation.
	ID string
	// Granted reports that the tokens were granted at once; else the
	// request is queued.
	Granted bool
	// Tokens is the number of tokens asked for (and granted, when
	// Granted).
	Tokens int64
	// ExpiresAt is when a granted reservation expires.
	ExpiresAt time.Time
	// Position is 0 when granted, else the request's place in the queue,
	// 1 for the head; EstimatedAt is then an upper estimate of its grant
	// (see reservation.Result).
	Position    int64
	EstimatedAt time.Time
}

// Reserve asks for a reservation. Its errors are those of
// reservation.Reserve: an *reservation.InvalidError naming the field
// ("resource" when no rule gives the resource a pool), or
// reservation.ErrQueueFull.
func (k *Keeper) Reserve(a Ask) (Result, error) {
	if a.Duration <= 0 || a.Duration%time.Microsecond != 0 {
		return Result{}, &reservation.InvalidError{Field: "duration", Reason: "not a positive number of microseconds"}
	}
	if a.Client == "" {
		return Result{}, &reservation.InvalidError{Field: "client", Reason: "empty"}
	}
	if k.denied(&policy.Request{ClientID: a.Client, Resource: a.Resource}) {
		return Result{}, ErrDenyListed
	}
	p, err := k.poolFor(a.Client, a.Resource)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := k.ctx()
	defer cancel()
	secret := randomHex(secretLen / 2)
	res, fx, err := k.be.Reserve(ctx, p, k.now(), reservation.Ask{
		Client: a.Client, Tokens: a.Tokens, Duration: a.Duration.Microseconds(), Priority: a.Priority,
	}, secret)
	k.emit(fx)
	if err != nil {
		return Result{}, err
	}
	out := Result{ID: publicID(p.Handle, secret), Granted: res.Granted, Tokens: a.Tokens, Position: res.Position}
	if res.Granted {
		out.ExpiresAt = micros(res.ExpiresAt)
	} else {
		out.EstimatedAt = micros(res.EstimatedAt)
	}
	return out, nil
}

// Status is the state of a reservation.
type Status struct {
	ID, Client, Resource string
	// Rule is the rule whose limit makes the pool.
	Rule string
	// State is "queued" or "granted".
	State string
	// Tokens is the number asked for (and granted).
	Tokens int64
	// Balance is what is left to use; Used what checks drew from it.
	// Both are 0 while queued.
	Balance, Used int64
	// GrantedAt and ExpiresAt are set once granted.
	GrantedAt, ExpiresAt time.Time
	// Position and EstimatedAt are, while queued, the request's place in
	// the queue (1 for the head) and an upper estimate of its grant.
	Position    int64
	EstimatedAt time.Time
}

// Get returns the state of reservation id. client, when not empty, must be
// the holder's (else ErrForbidden). An unknown, expired or released ID is
// reservation.ErrNotFound.
func (k *Keeper) Get(client, id string) (Status, error) {
	handle, secret, ok := parseID(id)
	if !ok {
		return Status{}, reservation.ErrNotFound
	}
	ctx, cancel := k.ctx()
	defer cancel()
	rec, fx, err := k.be.Get(ctx, handle, secret, client, k.now())
	k.emit(fx)
	if err != nil {
		return Status{}, err
	}
	return status(id, &rec), nil
}

// status returns the Status of rec, the record of id.
func status(id string, rec *Record) Status {
	st := Status{ID: id, Client: rec.Client, Resource: rec.Resource, Rule: rec.Rule, Tokens: rec.Tokens}
	if rec.Queued {
		st.State, st.Position, st.EstimatedAt = "queued", rec.Position, micros(rec.EstimatedAt)
		return st
	}
	st.State, st.Balance, st.Used = "granted", rec.Balance, rec.InUse
	st.GrantedAt, st.ExpiresAt = micros(rec.GrantedAt), micros(rec.ExpiresAt)
	return st
}

// Ended says how Release ended a reservation.
type Ended struct {
	// State is "released" (it was granted) or "cancelled" (it was
	// queued).
	State string
	// Returned is the number of tokens given back to the pool: the
	// balance not used. Tokens used stay held until expiry.
	Returned int64
}

// Release ends reservation id: a granted one is released, its balance
// returned to the pool; a queued one is cancelled. A second Release, like
// any later call with the ID, is reservation.ErrNotFound, so tokens are
// returned once. client, when not empty, must be the holder's.
func (k *Keeper) Release(client, id string) (Ended, error) {
	handle, secret, ok := parseID(id)
	if !ok {
		return Ended{}, reservation.ErrNotFound
	}
	ctx, cancel := k.ctx()
	defer cancel()
	end, fx, err := k.be.Release(ctx, handle, secret, client, k.now())
	k.emit(fx)
	if err != nil {
		return Ended{}, err
	}
	return end, nil
}

// Use draws n tokens from reservation id for a check of caller q (its
// ClientID must be the holder's), and
// returns the reservation's state after the draw. It is
// reservation.ErrInsufficient when the balance is short (nothing is
// drawn), reservation.ErrNotGranted while queued, reservation.ErrNotFound
// when the ID is unknown, expired or released, and ErrForbidden when
// another client holds it, ErrDenyListed when the policy deny-lists q
// (by any of its identities). n = 0 draws nothing.
func (k *Keeper) Use(q *policy.Request, id string, n int64) (Status, error) {
	if k.denied(q) {
		return Status{}, ErrDenyListed
	}
	handle, secret, ok := parseID(id)
	if !ok {
		return Status{}, reservation.ErrNotFound
	}
	ctx, cancel := k.ctx()
	defer cancel()
	rec, fx, err := k.be.Use(ctx, handle, secret, q.ClientID, k.now(), n)
	k.emit(fx)
	if err != nil {
		return Status{}, err
	}
	return status(id, &rec), nil
}

// Held returns the tokens held in the pool of (client, resource), and its
// capacity; 0, 0 when it has no pool. For tests and operators.
func (k *Keeper) Held(client, resource string) (held, capacity int64) {
	rule, _ := k.match(client, resource)
	if rule == nil {
		return 0, 0
	}
	ctx, cancel := k.ctx()
	defer cancel()
	pk, err := k.be.Peek(ctx, PoolHandle(rule.ID, resource), "", k.now())
	if err != nil {
		return 0, 0
	}
	return pk.Held, pk.Capacity
}

// Queued returns the place in its pool's queue of client's first request
// queued for resource, and the estimated instant of its grant; ok is false
// when client has none queued there (or the Backend cannot say). A check
// refused by the limits tells its client this, so that it waits its turn
// rather than retrying.
func (k *Keeper) Queued(client, resource string) (position int64, at time.Time, ok bool) {
	rule, _ := k.match(client, resource)
	if rule == nil {
		return 0, time.Time{}, false
	}
	ctx, cancel := k.ctx()
	defer cancel()
	pk, err := k.be.Peek(ctx, PoolHandle(rule.ID, resource), client, k.now())
	if err != nil || pk.Position == 0 {
		return 0, time.Time{}, false
	}
	return pk.Position, micros(pk.EstimatedAt), true
}

// apiFields names, as the HTTP and gRPC APIs do, the fields of a
// reservation.InvalidError.
var apiFields = map[string]string{
	"tokens": "tokens_needed", "duration": "duration_seconds", "client": "client_id",
	"priority": "priority", "resource": "resource",
}

// InvalidField returns the API's name of the field err (a
// reservation.InvalidError) refuses, and why; ok is false for any other
// error.
func InvalidField(err error) (field, reason string, ok bool) {
	var ie *reservation.InvalidError
	if !errors.As(err, &ie) {
		return "", "", false
	}
	if name, known := apiFields[ie.Field]; known {
		return name, ie.Reason, true
	}
	return ie.Field, ie.Reason, true
}
