package sluice

import "time"

// Reason says why a Decision came out as it did.
type Reason uint8

const (
	// ReasonAllowed means the request was admitted.
	ReasonAllowed Reason = iota
	// ReasonLimited means the limit is exhausted for now; RetryAfter says
	// when the same request would be admitted.
	ReasonLimited
	// ReasonCostExceedsCapacity means the cost is larger than the limit or
	// burst, so the request can never be admitted; RetryAfter is 0.
	ReasonCostExceedsCapacity
	// ReasonDenyAll means the limit denies every request.
	ReasonDenyAll
)

var reasonNames = [...]string{
	ReasonAllowed:             "allowed",
	ReasonLimited:             "limited",
	ReasonCostExceedsCapacity: "cost_exceeds_capacity",
	ReasonDenyAll:             "deny_all",
}

// String returns the wire name of r, such as "limited".
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Decision is the answer to one check of one limit. It is a plain value.
type Decision struct {
	// Allowed reports whether the request was admitted (and its cost
	// consumed).
	Allowed bool
	// Reason says why; ReasonAllowed when Allowed.
	Reason Reason
	// Limit is the configured limit (units per window).
	Limit int64
	// Remaining is how many units of cost could still be admitted right
	// now, after this request; never negative.
	Remaining int64
	// ResetAfter is how long, from the instant of the check, until the
	// limit is fully restored if nothing else arrives.
	ResetAfter time.Duration
	// RetryAfter is the shortest wait after which the same request would be
	// admitted if nothing else arrived; 0 when allowed, and 0 when the
	// request can never be admitted (see Reason).
	RetryAfter time.Duration
}
