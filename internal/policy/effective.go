// The limits that apply to one identity, as the admin API shows them.

package policy

import (
	"slices"
	"time"
)

// EffectiveLimit is the limit one rule applies to an identity at an instant.
type EffectiveLimit struct {
	// Rule is the rule's id.
	Rule string `json:"rule"`
	// Tier is the identity's tier.
	Tier string `json:"tier"`
	// Algorithm, Limit, Window and Burst are the limit as configured,
	// before any throttle; Window in Go's duration syntax ("1m0s").
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window"`
	Burst     int64  `json:"burst,omitempty"`
	// Source says where the limit came from: "rule" (the rule's own),
	// "tier" (the tier's), "override" (a layer override, OverrideID) or
	// "assignment" (an assignment of the configuration file).
	Source     string `json:"source"`
	OverrideID string `json:"override_id,omitempty"`
	// ThrottlePercent is the throttle cutting the limit now (0 to 100);
	// EffectiveLimit and EffectiveBurst are the limit and burst after it.
	ThrottlePercent float64 `json:"throttle_percent,omitempty"`
	EffectiveLimit  int64   `json:"effective_limit"`
	EffectiveBurst  int64   `json:"effective_burst,omitempty"`
}

// EffectiveLimits returns, in policy order, the limit each rule counting
// by dimension kind (alone or within a composite such as user+endpoint)
// applies to the identity value at now, whatever the rule's match
// conditions: its tier, where the limit came from, and the throttle
// cutting it. For kind DimClient the client's throttles apply; for the
// other kinds only the global and region ones. Rules without a limit for
// the identity's tier are left out.
func (p *Policy) EffectiveLimits(kind Dimension, value string, now time.Time) []EffectiveLimit {
	q := &Request{}
	switch kind {
	case DimClient:
		q.ClientID = value
	case DimUser:
		q.User = value
	case DimAPIKey:
		q.APIKey = value
	case DimIP:
		q.IP = value
	}
	tier, a := p.Lookup(q, now)
	cut := p.Throttle(q.ClientID, now)
	var out []EffectiveLimit
	for _, r := range p.Rules {
		if !slices.Contains(r.Dimension, kind) {
			continue
		}
		l, src, oid := r.limitAt(tier, a, now)
		if l == nil {
			continue
		}
		e := EffectiveLimit{Rule: r.ID, Tier: tier, Algorithm: l.Spec.Algorithm.String(), Limit: l.Spec.Limit,
			Window: l.Spec.Window.String(), Burst: l.Spec.Burst, Source: src, OverrideID: oid,
			ThrottlePercent: cut, EffectiveLimit: l.Spec.Limit, EffectiveBurst: l.Spec.Burst}
		if cut > 0 {
			c := p.Cut(l, cut)
			e.EffectiveLimit, e.EffectiveBurst = c.Spec.Limit, c.Spec.Burst
			if c.Spec.DenyAll {
				e.EffectiveLimit, e.EffectiveBurst = 0, 0
			}
		}
		out = append(out, e)
	}
	return out
}
