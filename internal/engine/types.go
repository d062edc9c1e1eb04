package engine

import (
	"time"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
)

// Priority is how urgent a check is. Priorities scale the limit a rule
// grants: high 1.2x, normal 1x, low 0.8x by default (the
// policy's defaults.priority_multipliers change them). It is the policy's
// type, so that the policy can compile one limit per priority.
type Priority = policy.Priority

// The priorities.
const (
	PriorityNormal = policy.PriorityNormal
	PriorityHigh   = policy.PriorityHigh
	PriorityLow    = policy.PriorityLow
)

// ParsePriority returns the priority named s ("high", "normal", "low");
// the empty string is normal.
func ParsePriority(s string) (Priority, bool) { return policy.ParsePriority(s) }

// Source says what decided a check.
type Source uint8

// The decision sources. Their String values appear in API responses and
// metric labels.
const (
	SourceStore          Source = iota // the store (memory, Redis) decided
	SourceOverLimitCache               // a cached denial, no store call
	SourceHotKey                       // the local tier of a hot key
	SourceFailOpen                     // the store failed; the rule fails open
	SourceLocal                        // the store failed; an in-process share of the limit decided
	SourceAllowList                    // the identity is on an allow list
	SourceDenyList                     // the identity is on a deny list
	SourceIdempotent                   // a repeated idempotency key: the first decision
	SourceNoRule                       // no rule matched: allowed, nothing counted
	SourceFailClosed                   // the store failed; the rule fails closed
)

var sourceNames = [...]string{
	SourceStore:          "store",
	SourceOverLimitCache: "over_limit_cache",
	SourceHotKey:         "hot_key",
	SourceFailOpen:       "fail_open",
	SourceLocal:          "local",
	SourceAllowList:      "allow_list",
	SourceDenyList:       "deny_list",
	SourceIdempotent:     "idempotent",
	SourceNoRule:         "no_rule",
	SourceFailClosed:     "fail_closed",
}

// String returns the wire name of s, such as "over_limit_cache".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Fallback says why a rule was decided without the store (by its failure
// mode: SourceFailOpen, SourceLocal, SourceFailClosed); the zero value,
// FallbackNone, is a decision that did not fall back. The store package
// defines it, for the store decorators that give up on a call to say why.
type Fallback = store.Fallback

// The reasons of a fallback (see store.Fallback).
const (
	FallbackNone        = store.FallbackNone
	FallbackUnreachable = store.FallbackUnreachable
	FallbackStalled     = store.FallbackStalled
	FallbackDeadline    = store.FallbackDeadline
	FallbackBreakerOpen = store.FallbackBreakerOpen
	FallbackOverloaded  = store.FallbackOverloaded
)

// Fallbacks lists the reasons of a fallback, FallbackNone left out.
var Fallbacks = store.Fallbacks

// FallbackOf returns why a store call that failed with err did not decide
// (see store.FallbackOf).
func FallbackOf(err error) Fallback { return store.FallbackOf(err) }

// Check is one request to decide: who, what, how much and how urgent.
// Transports fill it from their wire formats; the engine validates it.
type Check struct {
	// ClientID identifies the calling client; required.
	ClientID string
	// User, IP and APIKey identify the end user where rules need them.
	User, IP, APIKey string
	// Resource is the endpoint or resource, such as "/api/v1/orders".
	Resource string
	// Method is the HTTP method or RPC name, such as "GET".
	Method string
	// Operation is the kind of operation (read, write, delete) that picks
	// a rule's cost multiplier.
	Operation string
	// Cost is the base cost before multipliers; 0 reads without consuming.
	Cost int64
	// Priority scales the limits that apply.
	Priority Priority
	// IdempotencyKey, when set, makes a repeated check within the
	// idempotency TTL return the first decision and charge once. A repeat
	// is one by the same client on the same counters (see Engine.Check).
	IdempotencyKey string
	// Now is the instant of the check; zero means the engine's clock.
	Now time.Time
}

// RuleResult is the outcome of one rule for one check.
type RuleResult struct {
	// Rule is the rule's id.
	Rule string
	// Tier is the tier whose limit applied, if any.
	Tier string
	// Allowed reports whether this rule admitted the check.
	Allowed bool
	// Shadow reports that the rule is in shadow mode: it decides and
	// reports but never denies.
	Shadow bool
	// Global marks the result of the rule's global limit, shared by every
	// region: Limit is that limit and Remaining what all regions together
	// may still admit, as this region knows it. A rule with its own limit
	// and a global limit has two results, its own limit's and this one; a
	// rule with only a global limit has this one alone.
	Global bool
	// Limit, Remaining, ResetAfter and RetryAfter are as in sluice.Decision.
	Limit, Remaining       int64
	ResetAfter, RetryAfter time.Duration
	// Cost is the cost this rule charged, after multipliers.
	Cost int64
	// Source says what decided this rule.
	Source Source
	// Fallback says why the store did not decide, when Source is
	// SourceFailOpen, SourceLocal or SourceFailClosed.
	Fallback Fallback
	// ThrottlePercent is the percent (0 to 100) by which an emergency
	// throttle cut the rule's limit; 0 when none did.
	ThrottlePercent float64
}

// Result is the outcome of a check: allowed only when every rule that
// matched allowed it (shadow rules never deny).
type Result struct {
	// Allowed reports whether the check may go through.
	Allowed bool
	// ShadowDenied reports that a shadow-mode rule would have denied.
	ShadowDenied bool
	// Unavailable reports a denial because the store could not answer and
	// the rule fails closed (HTTP 503, gRPC Unavailable), distinct from a
	// rate-limit denial (429).
	Unavailable bool
	// Deciding is the rule that decided the answer: the first denying rule
	// when denied (the first that can never admit the check, if one
	// cannot, with no RetryAfter; otherwise with the longest RetryAfter of
	// the denying rules), the most constrained rule (least remaining) when
	// allowed. Its fields give the response's limit, remaining, reset and
	// retry-after.
	Deciding RuleResult
	// Rules holds the outcome of every rule that matched, in policy order.
	Rules []RuleResult
	// Source says what decided the check as a whole.
	Source Source
	// Fallback says why the store did not decide the deciding rule, or
	// a rule that failed closed; FallbackNone when it did.
	Fallback Fallback
	// ThrottlePercent is the percent (0 to 100) by which an emergency
	// throttle cut the limits of the check's rules; 0 when none did.
	ThrottlePercent float64
}

// CallerTier returns the caller's tier as the check applied it: the tier
// of the deciding rule's limit or, when that rule does not depend on tiers,
// of the first other rule whose limit came from a tier; "" when no rule's
// did. Every API reports this one.
func (r *Result) CallerTier() string {
	if r.Deciding.Tier != "" {
		return r.Deciding.Tier
	}
	for i := range r.Rules {
		if r.Rules[i].Tier != "" {
			return r.Rules[i].Tier
		}
	}
	return ""
}

// GlobalRemaining returns what every region together may still admit of
// the check's global limits, as this region knows it (the least among
// them), and whether any applied.
func (r *Result) GlobalRemaining() (remaining int64, ok bool) {
	for i := range r.Rules {
		if rr := &r.Rules[i]; rr.Global && (!ok || rr.Remaining < remaining) {
			remaining, ok = rr.Remaining, true
		}
	}
	return remaining, ok
}
