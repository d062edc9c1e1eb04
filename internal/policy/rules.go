// The decoder of the rules: ids, match, dimension, failure mode, and the
// rule's own limit and its limits per tier.

package policy

import (
	"fmt"
	"path"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyspace"
)

// validID reports whether s is usable as a rule id or tier name.
func validID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

var ruleKeys = []string{"id", "name", "match", "dimension", "algorithm", "limit", "window", "burst",
	"tiered", "tiers", "cost_multipliers", "shadow", "failure_mode", "expected_instances", "global_limit",
	"reservations"}

func (d *decoder) rules(n *yaml.Node, st *settings, p *Policy) {
	items := d.seq(n, "rules")
	if len(items) > MaxRules {
		d.errorf(n, "rules: %d rules is more than the maximum %d", len(items), MaxRules)
		return
	}
	firstLine := map[string]int{}
	for i, item := range items {
		what := fmt.Sprintf("rules[%d]", i)
		fs := d.fields(item, what, ruleKeys...)
		if fs == nil {
			continue
		}
		r := &Rule{Index: len(p.Rules), FailureMode: st.failure, ExpectedInstances: st.instances, CostMultipliers: st.costs}
		limitFields := []field{}
		var tiersNode, globalNode, rsvNode *yaml.Node
		dimSet := false
		ok := true
		for _, f := range fs {
			switch f.key {
			case "id":
				if s, good := d.str(f.v, what+".id"); good {
					if !validID(s) {
						d.errorf(f.v, "%s.id: %q: use 1 to 128 letters, digits, '_', '-' and '.'", what, s)
						ok = false
					} else if line, dup := firstLine[s]; dup {
						d.errorf(f.v, "%s.id: duplicate rule id %q (first at line %d)", what, s, line)
						ok = false
					} else {
						firstLine[s] = f.v.Line
						r.ID = s
						what = fmt.Sprintf("rule %q", s)
					}
				}
			case "name":
				r.Name, _ = d.str(f.v, what+".name")
			case "match":
				d.match(f.v, what+".match", r)
			case "dimension":
				dimSet = true
				if s, good := d.str(f.v, what+".dimension"); good {
					dims, err := parseDimensions(s)
					if err != "" {
						d.errorf(f.v, "%s.dimension: %s", what, err)
						ok = false
					}
					r.Dimension, r.DimensionName = dims, s
				}
			case "algorithm", "limit", "window", "burst":
				limitFields = append(limitFields, f)
			case "tiered":
				r.Tiered, _ = d.bool(f.v, what+".tiered")
			case "tiers":
				tiersNode = f.v
			case "cost_multipliers":
				if m := d.costMultipliers(f.v, what+".cost_multipliers"); m != nil {
					r.CostMultipliers = m
				}
			case "shadow":
				r.Shadow, _ = d.bool(f.v, what+".shadow")
			case "failure_mode":
				if m, good := d.failureMode(f.v, what+".failure_mode"); good {
					r.FailureMode = m
				}
			case "expected_instances":
				if v, good := d.instances(f.v, what+".expected_instances"); good {
					r.ExpectedInstances = v
				}
			case "global_limit":
				globalNode = f.v
			case "reservations":
				rsvNode = f.v
			}
		}
		if r.ID == "" {
			if ok {
				d.errorf(item, "%s: missing id", what)
			}
			continue
		}
		if !dimSet {
			r.Dimension, r.DimensionName = []Dimension{DimClient}, "client"
		}
		r.keyPrefix = keyspace.RulePrefix(r.ID)
		base := d.limitSpec(item, what, limitFields)
		base.node = item
		globalOnly := globalNode != nil && !base.hasLim && !r.Tiered
		switch {
		case base.present && r.Tiered:
			d.errorf(item, "%s: a tiered rule takes its limits from the tiers; remove algorithm, limit, window and burst, or use tiers: to set this rule's limit per tier", what)
		case globalOnly:
			d.globalOnly(item, what, base, tiersNode != nil)
		case base.present && !base.hasLim:
			d.errorf(item, "%s: missing limit: set limit, or global_limit for a limit shared by every region alone", what)
			if !base.hasWin {
				d.errorf(item, "%s: missing window", what)
			}
		case base.present:
			spec := base.over(limitSpec{alg: st.alg})
			if d.complete(spec, item, what) {
				r.Base = d.compile(spec, st, r.FailureMode, r.ExpectedInstances, what, 1)
			}
		case !r.Tiered:
			d.errorf(item, "%s: missing limit: set limit and window, global_limit and window, or tiered: true to take the limit from the identity's tier", what)
		}
		if globalNode != nil {
			d.globalLimit(globalNode, what, r, base)
		}
		if globalOnly {
			// Its per-tier limits were refused: none is compiled.
			tiersNode = nil
		}
		if rsvNode != nil {
			d.reservations(rsvNode, what, r)
		}
		if r.Tiered {
			if len(st.tierNames) == 0 {
				d.errorf(item, "%s: tiered: true needs tiers at the top level", what)
			}
		}
		perTier := map[string]limitSpec{}
		if tiersNode != nil {
			for _, tf := range d.fields(tiersNode, what+".tiers") {
				if _, known := st.tiers[tf.key]; !known {
					d.errorf(tf.k, "%s.tiers: unknown tier %q", what, tf.key)
					continue
				}
				perTier[tf.key] = d.limitSpec(tf.v, what+".tiers."+tf.key, nil)
			}
		}
		if r.Tiered || len(perTier) > 0 {
			r.byTier = map[string]*Limit{}
			for _, t := range st.tierNames {
				s, has := perTier[t]
				var parent limitSpec
				if r.Tiered {
					parent = st.tiers[t]
				} else {
					parent = base.over(limitSpec{alg: st.alg})
				}
				if !has && !r.Tiered || parent.bad {
					// A bad parent (a tier's limit, the rule's own) is
					// reported where it is written.
					continue
				}
				spec := s.over(parent)
				if !has {
					spec.node = item
				}
				if d.complete(spec, spec.node, what+".tiers."+t) {
					if l := d.compile(spec, st, r.FailureMode, r.ExpectedInstances, what+".tiers."+t, 1); l != nil {
						r.byTier[t] = l
					}
				}
			}
		}
		p.Rules = append(p.Rules, r)
	}
}

func parseDimensions(s string) ([]Dimension, string) {
	parts := strings.Split(s, "+")
	dims := make([]Dimension, 0, len(parts))
	for _, part := range parts {
		dm, ok := parseDimension(strings.TrimSpace(part))
		if !ok {
			return nil, fmt.Sprintf("unknown dimension %q (want client, user, ip, api_key, endpoint, method, operation or global, or a composite such as user+endpoint)", part)
		}
		for _, x := range dims {
			if x == dm {
				return nil, fmt.Sprintf("dimension %q appears twice", part)
			}
		}
		dims = append(dims, dm)
	}
	if len(dims) > 1 {
		for _, x := range dims {
			if x == DimGlobal {
				return nil, "global cannot be part of a composite dimension"
			}
		}
	}
	return dims, ""
}

func (d *decoder) match(n *yaml.Node, what string, r *Rule) {
	for _, f := range d.fields(n, what, "resource", "method", "operation", "client") {
		switch f.key {
		case "resource":
			for _, s := range d.strings(f.v, what+".resource") {
				if err := checkPattern(s); err != "" {
					d.errorf(f.v, "%s.resource: %q: %s", what, s, err)
					continue
				}
				r.Resources = append(r.Resources, s)
			}
		case "method":
			for _, s := range d.strings(f.v, what+".method") {
				r.Methods = append(r.Methods, strings.ToUpper(s))
			}
		case "operation":
			for _, s := range d.strings(f.v, what+".operation") {
				r.Operations = append(r.Operations, strings.ToLower(s))
			}
		case "client":
			for _, s := range d.strings(f.v, what+".client") {
				if s == "" {
					d.errorf(f.v, "%s.client: a client id must not be empty", what)
					continue
				}
				r.Clients = append(r.Clients, s)
			}
		}
	}
}

// checkPattern validates a resource pattern; "" when it is valid.
func checkPattern(s string) string {
	if len(s) > 1024 {
		return "longer than 1024 bytes"
	}
	if isGlob(s) {
		if _, err := path.Match(s, ""); err != nil {
			return "bad glob pattern"
		}
	}
	return ""
}

// globalOnly checks the limit fields of a rule whose only limit is its
// global_limit (base, as written: no limit): its window is the global
// limit's, and nothing else of a regional limit may be set.
func (d *decoder) globalOnly(n *yaml.Node, what string, base limitSpec, tiers bool) {
	switch {
	case base.alg != 0:
		d.errorf(n, "%s.algorithm: a rule with only a global_limit counts it in fixed windows; remove algorithm, or set limit for a regional limit of that algorithm", what)
	case base.hasBur:
		d.errorf(n, "%s.burst: a rule with only a global_limit has no burst; remove burst, or set limit for a regional limit with a burst", what)
	case !base.hasWin:
		d.errorf(n, "%s: missing window: a global_limit counts per the rule's window", what)
	case tiers:
		d.errorf(n, "%s.tiers: a rule with only a global_limit has no limit of its own to set per tier; set limit, or remove tiers", what)
	}
}

// globalLimit compiles the rule's global_limit: the units per the rule's
// window that every region together admits. It is counted in fixed
// windows (the one algorithm whose windows every region cuts alike, from
// the epoch), beside the rule's own limit when it has one, which still
// applies in each region. base is the rule's limit fields as written.
func (d *decoder) globalLimit(n *yaml.Node, what string, r *Rule, base limitSpec) {
	v, ok := d.int64(n, what+".global_limit")
	if !ok {
		return
	}
	if r.Tiered {
		d.errorf(n, "%s.global_limit: a tiered rule takes its limits from the tiers, which have no global limit; remove global_limit or tiered", what)
		return
	}
	if r.Shadow {
		d.errorf(n, "%s.global_limit: a shadow rule never denies; remove global_limit or shadow", what)
		return
	}
	window := base.window
	if base.hasLim {
		if r.Base == nil || r.Base.Spec.DenyAll {
			// The rule's own limit is bad, and reported.
			return
		}
		window = r.Base.Spec.Window
	} else if !base.hasWin || base.bad || base.alg != 0 || base.hasBur {
		return // reported by globalOnly
	}
	p, err := algorithm.Compile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: v, Window: window})
	if err != nil || v < 1 {
		d.errorf(n, "%s.global_limit: %d per %s: must be at least 1 and at most %d, per a window longer than 0", what, v, window, int64(sluice.MaxLimit))
		return
	}
	r.Global = &p
	if r.Base == nil && r.FailureMode == FailLocal {
		// With no regional limit, the local failure mode's share is the
		// global limit's, split among the region's instances.
		lp, err := algorithm.Compile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: ceilDiv(v, r.ExpectedInstances), Window: window})
		if err != nil {
			d.errorf(n, "%s.global_limit: local share: %v", what, err)
			return
		}
		r.GlobalLocal = &lp
	}
}
