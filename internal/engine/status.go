// Status and Reset: reading and forgetting the state of the rules that apply
// to a check, without deciding it.

package engine

import (
	"context"

	"github.com/sluicehq/sluice/store"
)

// Status returns, for every rule that applies to c, its limit and remaining
// quota, consuming nothing (c.Cost is ignored).
func (e *Engine) Status(ctx context.Context, c *Check) ([]RuleResult, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := e.policy.Load()
	q := request(c)
	if r, ok := listed(p, &q); ok {
		return r.Rules, nil
	}
	s := e.getScratch()
	defer e.putScratch(s)
	peek := *c
	peek.Cost = 0
	if err := e.plan(s, p, &peek, &q, 0, ""); err != nil {
		return nil, err
	}
	if len(s.items) == 0 {
		return nil, nil
	}
	e.finishKeys(s)
	s.reqs = s.reqs[:0]
	for i := range s.items {
		it := &s.items[i]
		at := c.Now
		if it.gbase != nil {
			at = it.at // the window the sync names
		}
		s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: 0, Now: at})
	}
	s.out = grow(s.out, len(s.reqs))
	if err := e.call(ctx, &s.call, false, s.reqs, s.out, nil); err != nil {
		return nil, err
	}
	out := make([]RuleResult, len(s.items))
	for i := range s.items {
		it := &s.items[i]
		d := s.out[i]
		out[i] = RuleResult{Rule: it.rule.ID, Tier: it.tier, Allowed: d.Allowed, Shadow: it.shadow,
			Limit: d.Limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter, Source: SourceStore,
			ThrottlePercent: it.throttle}
		if it.gbase != nil {
			globalResult(&out[i], it)
		}
	}
	return out, nil
}

// Reset forgets the state of every rule that applies to c, under every
// limit the rule may apply to c (its own, each tier's, c's overrides). It
// leaves the counts of global limits, which every region holds: this
// region forgetting its own would not reach the others' view of it.
func (e *Engine) Reset(ctx context.Context, c *Check) error {
	if err := c.Validate(); err != nil {
		return err
	}
	p := e.policy.Load()
	q := request(c)
	now := e.clock(c)
	tier, asg := p.Lookup(&q, now)
	rules := p.Match(&q, nil)
	var keys []string
	seen := map[string]bool{}
	for _, r := range rules {
		limits := r.Limits()
		if l := r.LimitAt(tier, asg, now); l != nil {
			limits = append(limits, l)
		}
		for _, l := range limits {
			k, ok := r.AppendKey(nil, l, &q)
			if ok && !seen[string(k)] {
				seen[string(k)] = true
				keys = append(keys, string(k))
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if err := e.store.Reset(ctx, keys...); err != nil {
		return err
	}
	return e.local.Reset(ctx, keys...)
}
