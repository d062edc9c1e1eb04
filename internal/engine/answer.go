// The third step of a check, answer: the decided items become a Result, with
// the rule that decided it and the source of the decision.

package engine

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/policy"
)

// listed decides a check from the allow and deny lists; ok is false when
// neither applies.
func listed(p *policy.Policy, q *policy.Request) (r Result, ok bool) {
	if p.Denied(q) {
		rr := RuleResult{Rule: "deny_list", Source: SourceDenyList}
		return Result{Allowed: false, Deciding: rr, Rules: []RuleResult{rr}, Source: SourceDenyList}, true
	}
	if p.Allowed(q) {
		rr := RuleResult{Rule: "allow_list", Allowed: true, Source: SourceAllowList}
		return Result{Allowed: true, Deciding: rr, Source: SourceAllowList}, true
	}
	return Result{}, false
}

// assemble builds the Result of a check from its items; allowed is the
// verdict of its enforcing rules.
func assemble(items []item, allowed bool) Result {
	return assembleIn(make([]RuleResult, len(items)), items, allowed)
}

// assembleIn is assemble writing the rules' results to rules, as long as
// items: a batch gives each check its part of one slice.
func assembleIn(rules []RuleResult, items []item, allowed bool) Result {
	res := Result{Allowed: allowed, Rules: rules}
	deciding := -1
	var maxRetry time.Duration
	never := false // a denying rule can never admit the check
	for i := range items {
		it := &items[i]
		rr := RuleResult{Rule: it.rule.ID, Tier: it.tier, Allowed: it.dec.Allowed, Shadow: it.shadow,
			Limit: it.dec.Limit, Remaining: it.dec.Remaining, ResetAfter: it.dec.ResetAfter,
			RetryAfter: it.dec.RetryAfter, Cost: it.charged, Source: it.source, Fallback: it.fallback,
			ThrottlePercent: it.throttle}
		if rr.Limit == 0 && !it.params.DenyAll {
			rr.Limit = it.params.Limit
		}
		if it.gbase != nil {
			globalResult(&rr, it)
		}
		res.Rules[i] = rr
		if it.shadow {
			if !it.dec.Allowed {
				res.ShadowDenied = true
			}
			continue
		}
		if it.source == SourceFailClosed {
			res.Unavailable = true
			res.Fallback = it.fallback
		}
		if allowed {
			if deciding < 0 || rr.Remaining < res.Rules[deciding].Remaining {
				deciding = i
			}
		} else if !rr.Allowed {
			// The first rule that can never admit the check decides
			// it, else the first denying rule.
			n := it.dec.Reason == sluice.ReasonCostExceedsCapacity || it.dec.Reason == sluice.ReasonDenyAll
			if deciding < 0 || n && !never {
				deciding = i
			}
			never = never || n
			maxRetry = max(maxRetry, rr.RetryAfter)
		}
	}
	if deciding < 0 {
		// No enforcing rule denied (a check refused with its batch), or
		// only shadow rules apply: the most constrained enforcing rule,
		// or without one the most constrained shadow rule. A shadow rule
		// never decides a denial.
		for i := range res.Rules {
			r, d := &res.Rules[i], &res.Rules[max(deciding, 0)]
			if deciding < 0 || d.Shadow && !r.Shadow || d.Shadow == r.Shadow && r.Remaining < d.Remaining {
				deciding = i
			}
		}
	}
	res.Deciding = res.Rules[deciding]
	res.ThrottlePercent = items[0].throttle
	if !allowed {
		// A retry can succeed once every denying rule admits it: never,
		// when one of them cannot.
		res.Deciding.RetryAfter = maxRetry
		if never {
			res.Deciding.RetryAfter = 0
		}
	}
	res.Source = res.Deciding.Source
	if res.Unavailable {
		res.Source = SourceFailClosed
	} else {
		res.Fallback = res.Deciding.Fallback
	}
	return res
}
