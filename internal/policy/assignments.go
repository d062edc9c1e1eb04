// The decoder of what applies to identities: assignments (an identity's
// tier and limit overrides) and the allow and deny lists.

package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

var assignmentKeys = []string{"client", "user", "api_key", "tier", "limits", "expires_at"}

func (d *decoder) assignments(n *yaml.Node, st *settings, p *Policy) {
	rules := map[string]*Rule{}
	for _, r := range p.Rules {
		rules[r.ID] = r
	}
	for i, item := range d.seq(n, "assignments") {
		what := fmt.Sprintf("assignments[%d]", i)
		fs := d.fields(item, what, assignmentKeys...)
		if fs == nil {
			continue
		}
		a := &Assignment{}
		var limitsNode *yaml.Node
		for _, f := range fs {
			switch f.key {
			case "client", "user", "api_key":
				if a.Kind != 0 {
					d.errorf(f.k, "%s: give one of client, user or api_key", what)
					continue
				}
				if s, ok := d.str(f.v, what+"."+f.key); ok && s != "" {
					dm, _ := parseDimension(f.key)
					a.Kind, a.Value = dm, s
				}
			case "tier":
				if s, ok := d.str(f.v, what+".tier"); ok {
					if _, known := st.tiers[s]; !known {
						d.errorf(f.v, "%s.tier: unknown tier %q", what, s)
					}
					a.Tier = s
				}
			case "limits":
				limitsNode = f.v
			case "expires_at":
				if s, ok := d.str(f.v, what+".expires_at"); ok {
					t, err := time.Parse(time.RFC3339, s)
					if err != nil {
						d.errorf(f.v, "%s.expires_at: want an RFC 3339 time such as 2030-01-02T15:04:05Z, got %q", what, s)
					}
					a.ExpiresAt = t
				}
			}
		}
		if a.Kind == 0 {
			d.errorf(item, "%s: missing client, user or api_key", what)
			continue
		}
		if limitsNode != nil {
			a.Limits = map[string]*Limit{}
			for _, lf := range d.fields(limitsNode, what+".limits") {
				r, ok := rules[lf.key]
				if !ok {
					d.errorf(lf.k, "%s.limits: unknown rule id %q", what, lf.key)
					continue
				}
				if r.GlobalOnly() {
					d.errorf(lf.k, "%s.limits.%s: rule %q has only a global_limit, shared by every identity's regions alike; an identity's limits cannot change it", what, lf.key, lf.key)
					continue
				}
				s := d.limitSpec(lf.v, what+".limits."+lf.key, nil)
				// Unset fields come from the limit the rule would apply to
				// this identity's tier.
				tier := a.Tier
				if tier == "" {
					tier = st.defaultTier
				}
				parent := limitSpec{alg: st.alg}
				if l := r.LimitFor(tier, nil); l != nil {
					b := l.Spec
					parent = limitSpec{alg: b.Algorithm, limit: b.Limit, window: b.Window, burst: b.Burst, hasLim: true, hasWin: true, hasBur: b.Burst > 0}
				} else {
					// The rule's limit for the tier has a problem,
					// reported at the rule or the tier: what the
					// override leaves out is not also reported as
					// missing.
					parent.bad = true
				}
				spec := s.over(parent)
				if parent.bad && !(s.hasLim && s.hasWin) {
					continue
				}
				if d.complete(spec, lf.v, what+".limits."+lf.key) {
					if l := d.compile(spec, st, r.FailureMode, r.ExpectedInstances, what+".limits."+lf.key, 1); l != nil {
						a.Limits[r.ID] = l
					}
				}
			}
		}
		if p.assignments[a.Kind] == nil {
			p.assignments[a.Kind] = map[string][]*Assignment{}
		}
		p.assignments[a.Kind][a.Value] = append(p.assignments[a.Kind][a.Value], a)
	}
}

// Assignments returns the configuration file's assignments active at now,
// by kind (client, user, api_key) and identity, each identity's in file
// order. The control plane's identities and overrides are not among them:
// they are the layer's (see Layer). It is for display; Lookup decides.
func (p *Policy) Assignments(now time.Time) []*Assignment {
	var out []*Assignment
	for _, m := range p.assignments {
		start := len(out)
		for _, as := range m {
			for _, a := range as {
				if a.active(now) {
					out = append(out, a)
				}
			}
		}
		// Sorted by identity; stable keeps each identity's file order.
		slices.SortStableFunc(out[start:], func(a, b *Assignment) int { return cmp.Compare(a.Value, b.Value) })
	}
	return out
}

func (d *decoder) identities(n *yaml.Node, what string, set *identitySet) {
	for i, item := range d.seq(n, what) {
		w := fmt.Sprintf("%s[%d]", what, i)
		fs := d.fields(item, w, "client", "user", "api_key", "ip")
		if len(fs) != 1 {
			if fs != nil {
				d.errorf(item, "%s: give exactly one of client, user, api_key or ip", w)
			}
			continue
		}
		f := fs[0]
		s, ok := d.str(f.v, w+"."+f.key)
		if !ok || s == "" {
			if ok {
				d.errorf(f.v, "%s.%s: must not be empty", w, f.key)
			}
			continue
		}
		if f.key == "ip" {
			if strings.Contains(s, "/") {
				pfx, err := netip.ParsePrefix(s)
				if err != nil {
					d.errorf(f.v, "%s.ip: %q is not an address or CIDR prefix", w, s)
					continue
				}
				if pfx.Addr().Is4In6() {
					// Checks' addresses are unmapped before matching, so a
					// mapped prefix is kept as the IPv4 prefix it covers.
					if pfx.Bits() < 96 {
						d.errorf(f.v, "%s.ip: %q is an IPv4-mapped prefix shorter than /96 (write the IPv4 prefix, or an IPv6 prefix without ::ffff:)", w, s)
						continue
					}
					pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
				}
				set.prefixes = append(set.prefixes, pfx.Masked())
				continue
			}
			addr, err := netip.ParseAddr(s)
			if err != nil {
				d.errorf(f.v, "%s.ip: %q is not an address or CIDR prefix", w, s)
				continue
			}
			set.prefixes = append(set.prefixes, netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()))
			continue
		}
		dm, _ := parseDimension(f.key)
		set.add(dm, s)
	}
}
