// The label values of the metrics: results, APIs, outcomes, operations, errors.

package metrics

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice"
)

// Result is the outcome of one rule for one check, as the decisions metric
// labels it.
type Result uint8

// The results.
const (
	// Allowed: the rule admitted the check.
	Allowed Result = iota
	// Denied: the rule denied the check.
	Denied
	// ShadowDenied: a shadow-mode rule would have denied (it never denies).
	ShadowDenied
	numResults
)

var resultNames = [numResults]string{"allowed", "denied", "shadow_denied"}

// String returns the label value of r, such as "shadow_denied".
func (r Result) String() string {
	if r < numResults {
		return resultNames[r]
	}
	return "unknown"
}

// API names the entry point of a check, as the check metrics label it.
type API uint8

// The APIs.
const (
	// APICheck is one check (HTTP POST /api/v1/check, gRPC CheckRateLimit).
	APICheck API = iota
	// APIBatch is a batch of checks.
	APIBatch
	// APIEnvoy is Envoy's ShouldRateLimit.
	APIEnvoy
	numAPIs
)

var apiNames = [numAPIs]string{"check", "batch", "envoy"}

// String returns the label value of a.
func (a API) String() string {
	if a < numAPIs {
		return apiNames[a]
	}
	return "unknown"
}

// Outcome is the outcome of a whole check, as the checks metric labels it.
type Outcome uint8

// The outcomes.
const (
	// OutcomeAllowed: the check may go through.
	OutcomeAllowed Outcome = iota
	// OutcomeDenied: a rule denied it (HTTP 429, Envoy OVER_LIMIT).
	OutcomeDenied
	// OutcomeUnavailable: denied because the store could not answer and a
	// rule fails closed (HTTP 503).
	OutcomeUnavailable
	// OutcomeInvalid: refused as malformed, nothing decided (HTTP 400).
	OutcomeInvalid
	// OutcomeError: any other error.
	OutcomeError
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"allowed", "denied", "unavailable", "invalid", "error"}

// String returns the label value of o.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// StoreOp names a store call, as the store metrics label it.
type StoreOp uint8

// The store operations.
const (
	// OpCheck is Store.Check (requests decided each on its own).
	OpCheck StoreOp = iota
	// OpCheckAll is Store.CheckAll (requests decided as one unit).
	OpCheckAll
	// OpCheckAllOnce is CheckAll made idempotent by key.
	OpCheckAllOnce
	// OpReset is Store.Reset.
	OpReset
	// OpSync is a batched sync of hot keys' local counts.
	OpSync
	numStoreOps
)

var storeOpNames = [numStoreOps]string{"check", "check_all", "check_all_once", "reset", "sync"}

// String returns the label value of op.
func (op StoreOp) String() string {
	if op < numStoreOps {
		return storeOpNames[op]
	}
	return "unknown"
}

// ErrorKind classifies a store error.
type ErrorKind uint8

// The error kinds.
const (
	// KindTimeout: the call's deadline passed.
	KindTimeout ErrorKind = iota
	// KindUnavailable: the store could not answer (down, unreachable,
	// breaker open).
	KindUnavailable
	// KindCanceled: the caller gave up.
	KindCanceled
	// KindOther: anything else.
	KindOther
	numKinds
)

var kindNames = [numKinds]string{"timeout", "unavailable", "canceled", "other"}

// String returns the label value of k.
func (k ErrorKind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// KindOf classifies err: timeout when it is or wraps
// context.DeadlineExceeded, canceled for context.Canceled, unavailable for
// sluice.ErrStoreUnavailable, other otherwise.
func KindOf(err error) ErrorKind {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.Is(err, sluice.ErrStoreUnavailable):
		return KindUnavailable
	}
	return KindOther
}
