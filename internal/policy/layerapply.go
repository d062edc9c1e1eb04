// Applying the control plane's layer to the file's policy: the layer's
// rules decoded as the file's, identities' tiers, overrides compiled on a
// typed path, and throttles; what did not change since the previous apply
// is reused, not compiled again.

package policy

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// LayerError is one problem of a layer's object. It wraps ErrInvalidConfig.
type LayerError struct {
	// Object is "rule", "identity", "override" or "throttle".
	Object string
	// ID is the object's id (an identity's "kind:value").
	ID string
	// Field is the object's JSON field at fault, such as "limit",
	// "match.resource" or "limits.api.window"; "" for the whole object.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error implements error as `rule "id": field: msg`.
func (e *LayerError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s %q: %s", e.Object, e.ID, e.Msg)
	}
	return fmt.Sprintf("%s %q: %s: %s", e.Object, e.ID, e.Field, e.Msg)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *LayerError) Unwrap() error { return ErrInvalidConfig }

// layerState is the layer a Policy was built with, and what was compiled
// for it, to be reused by the next WithLayer.
type layerState struct {
	revision int64
	region   string
	st       *settings // the file's, which compiled what is cached
	// ids are the identities the layer names, with their tier and
	// overrides, by kind and value.
	ids [DimGlobal + 1]map[string]*Assignment
	// tiers are the layer's identities' tiers.
	tiers map[identity]string
	// rules and overrides are the compiled objects by id, and order the
	// layer's rule ids in order. They are never modified once built.
	rules     map[string]*ruleEntry
	order     []string
	overrides map[string]*overrideEntry
	throttles throttles
	cuts      *cutCache
}

type ruleEntry struct {
	version int64
	rule    *Rule // as compiled, Index 0
}

// identity is one identity, by kind and value.
type identity struct {
	kind  Dimension
	value string
}

type overrideEntry struct {
	version int64
	who     identity
	tier    string
	parents map[string]*Limit // the limit each rule would apply, inherited from
	o       *override
}

// override is a compiled LayerOverride.
type override struct {
	id        string
	version   int64
	expiresAt time.Time
	limits    map[string]*Limit
}

func (o *override) active(now time.Time) bool {
	return o.expiresAt.IsZero() || now.Before(o.expiresAt)
}

// tierAt returns the tier a layered assignment gives at now ("" for the
// default one) and whether it applies at all: the layer's tier, else the
// tier of the file's first active assignment; it applies with either, or
// with an active override.
func (a *Assignment) tierAt(now time.Time) (string, bool) {
	fa := firstActive(a.base, now)
	t := a.Tier
	if t == "" && fa != nil {
		t = fa.Tier
	}
	if a.Tier != "" || fa != nil {
		return t, true
	}
	for _, o := range a.overrides {
		if o.active(now) {
			return t, true
		}
	}
	return "", false
}

func firstActive(as []*Assignment, now time.Time) *Assignment {
	for _, a := range as {
		if a.active(now) {
			return a
		}
	}
	return nil
}

// LimitAt returns the limit that applies at now under tier, for the
// assignment a that Lookup returned (may be nil): a layer override of the
// rule active at now (the newest, when several are), else the file's
// assignment's, else the tier's, else the rule's own. It returns nil when
// the rule has no limit for that tier.
func (r *Rule) LimitAt(tier string, a *Assignment, now time.Time) *Limit {
	l, _, _ := r.limitAt(tier, a, now)
	return l
}

// limitAt is LimitAt, with where the limit came from: "override" (and its
// id), "assignment", "tier" or "rule".
func (r *Rule) limitAt(tier string, a *Assignment, now time.Time) (*Limit, string, string) {
	if a != nil && a.layered {
		for _, o := range a.overrides {
			if l, ok := o.limits[r.ID]; ok && o.active(now) {
				return l, "override", o.id
			}
		}
		a = firstActive(a.base, now)
	}
	if a != nil {
		if l, ok := a.Limits[r.ID]; ok {
			return l, "assignment", ""
		}
	}
	if r.Tiered || len(r.byTier) > 0 {
		if l, ok := r.byTier[tier]; ok {
			return l, "tier", ""
		}
	}
	return r.Base, "rule", ""
}

// Layer returns the revision of the layer p was built with; 0 for the
// file's own policy.
func (p *Policy) Layer() int64 {
	if p.layer == nil {
		return 0
	}
	return p.layer.revision
}

// WithLayer returns a new policy: p, the configuration file's, with the
// layer l applied. p is not modified. prev, the previous result of
// WithLayer (may be nil), lends the rules and overrides whose id and
// version are unchanged, compiled already, so that a change of one object
// among many applies in milliseconds.
//
// The layer's rules are decoded and validated as items of the file's
// `rules:` list, with the file's defaults and tiers; one with the id of a
// file rule replaces it in place, the others follow the file's rules in
// the layer's order. A layer identity's tier takes precedence over the
// file's assignments of that identity, and so do its overrides' limits.
// When an identity has several active overrides of one rule, the newest
// (highest Version, then greatest id) applies. Unset fields of an
// override's limit are inherited from the limit the rule applies to the
// identity's tier. Throttles are checked at each check's instant (see
// Throttle).
//
// The error is a *LayerError naming the object and its field (several,
// joined); it wraps ErrInvalidConfig.
func (p *Policy) WithLayer(l *Layer, prev *Policy) (*Policy, error) {
	if p.layer != nil {
		return nil, errors.New("sluice: WithLayer: the policy has a layer already; apply layers to the file's policy")
	}
	st := p.st
	if st == nil {
		st = &settings{alg: DefaultAlgorithm, failure: DefaultFailureMode, instances: 1,
			costs: DefaultCostMultipliers(), high: DefaultHighMultiplier, low: DefaultLowMultiplier}
	}
	var old *layerState
	if prev != nil && prev.layer != nil && prev.layer.st == st {
		old = prev.layer
	}
	ls := &layerState{revision: l.Revision, region: l.Region, st: st}
	var errs []error
	fail := func(e *LayerError) {
		if len(errs) < maxErrors {
			errs = append(errs, e)
		}
	}

	// Rules: those of prev when no rule changed.
	if len(p.Rules)+len(l.Rules) > MaxRules {
		return nil, &LayerError{Object: "rule", Msg: fmt.Sprintf("%d rules is more than the maximum %d", len(p.Rules)+len(l.Rules), MaxRules)}
	}
	rulesSame := old != nil && len(old.order) == len(l.Rules)
	for i := 0; rulesSame && i < len(l.Rules); i++ {
		e := old.rules[l.Rules[i].ID]
		rulesSame = old.order[i] == l.Rules[i].ID && e != nil && e.version == l.Rules[i].Version
	}
	var rules []*Rule
	var m *matcher
	if rulesSame {
		rules, m, ls.rules, ls.order = prev.Rules, prev.matcher, old.rules, old.order
	} else {
		rules = p.layerRules(l, old, ls, fail)
	}
	byID := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		byID[r.ID] = r
	}

	// Identities and overrides: those that changed since prev are
	// compiled, and the identities they belong to assembled again.
	ls.tiers = make(map[identity]string, len(l.Identities))
	for _, li := range l.Identities {
		id := li.Kind.String() + ":" + li.Value
		if !identityKind(li.Kind) || li.Value == "" {
			fail(&LayerError{Object: "identity", ID: id, Field: "kind", Msg: "want a client, user or api_key with a value"})
			continue
		}
		if _, ok := st.tiers[li.Tier]; !ok {
			fail(&LayerError{Object: "identity", ID: id, Field: "tier", Msg: fmt.Sprintf("unknown tier %q", li.Tier)})
			continue
		}
		ls.tiers[identity{li.Kind, li.Value}] = li.Tier
	}
	tierFor := func(k identity) string {
		if t := ls.tiers[k]; t != "" {
			return t
		}
		if as := p.assignments[k.kind][k.value]; len(as) > 0 && as[0].Tier != "" {
			return as[0].Tier
		}
		return st.defaultTier
	}
	affected := map[identity]bool{}
	var oldOv map[string]*overrideEntry
	if old != nil {
		oldOv = old.overrides
		for k, t := range ls.tiers {
			if old.tiers[k] != t {
				affected[k] = true
			}
		}
		for k := range old.tiers {
			if _, ok := ls.tiers[k]; !ok {
				affected[k] = true
			}
		}
	} else {
		for k := range ls.tiers {
			affected[k] = true
		}
	}
	ls.overrides = maps.Clone(oldOv)
	if ls.overrides == nil {
		ls.overrides = make(map[string]*overrideEntry, len(l.Overrides))
	}
	seen := make(map[string]struct{}, len(l.Overrides))
	fresh := map[identity][]*override{}
	found := 0
	for i := range l.Overrides {
		lo := &l.Overrides[i]
		if _, dup := seen[lo.ID]; dup {
			fail(&LayerError{Object: "override", ID: lo.ID, Field: "id", Msg: "duplicate override id"})
			continue
		}
		seen[lo.ID] = struct{}{}
		if !identityKind(lo.Kind) || lo.Value == "" {
			fail(&LayerError{Object: "override", ID: lo.ID, Field: "kind", Msg: "want a client, user or api_key with a value"})
			continue
		}
		k := identity{lo.Kind, lo.Value}
		tier := tierFor(k)
		oe := oldOv[lo.ID]
		if oe != nil {
			found++
			if oe.version == lo.Version && oe.who == k && oe.tier == tier && (rulesSame || sameParents(oe.parents, byID, tier)) {
				continue
			}
			affected[oe.who] = true
		}
		e, le := compileOverride(lo, tier, byID, st)
		if le != nil {
			fail(le)
			continue
		}
		e.who = k
		ls.overrides[lo.ID] = e
		affected[k] = true
		fresh[k] = append(fresh[k], e.o)
	}
	if found != len(oldOv) {
		for id, oe := range oldOv {
			if _, ok := seen[id]; !ok {
				delete(ls.overrides, id)
				affected[oe.who] = true
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	p.assemble(ls, old, affected, fresh)

	// Throttles.
	ts, terrs := compileThrottles(l)
	for _, e := range terrs {
		fail(e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	ls.throttles = ts
	ls.cuts = newCutCache(st)

	if m == nil {
		m = newMatcher(rules)
	}
	np := *p
	np.Rules = rules
	np.matcher = m
	np.layer = ls
	np.Version = p.Version + "+" + strconv.FormatInt(l.Revision, 10)
	ls.cuts.warm(&np, ts)
	return &np, nil
}

// layerRules returns the file's rules with l's applied, compiling those not
// in old, and records them in ls.
func (p *Policy) layerRules(l *Layer, old *layerState, ls *layerState, fail func(*LayerError)) []*Rule {
	ls.rules = make(map[string]*ruleEntry, len(l.Rules))
	ls.order = make([]string, 0, len(l.Rules))
	fileIndex := make(map[string]int, len(p.Rules))
	for i, r := range p.Rules {
		fileIndex[r.ID] = i
	}
	rules := slices.Clone(p.Rules)
	for i := range l.Rules {
		lr := &l.Rules[i]
		if _, dup := ls.rules[lr.ID]; dup {
			fail(&LayerError{Object: "rule", ID: lr.ID, Field: "id", Msg: "duplicate rule id"})
			continue
		}
		var r *Rule
		if old != nil {
			if e := old.rules[lr.ID]; e != nil && e.version == lr.Version {
				r = e.rule
			}
		}
		if r == nil {
			var e *LayerError
			if r, e = decodeLayerRule(lr, ls.st); e != nil {
				fail(e)
				continue
			}
		}
		ls.rules[lr.ID] = &ruleEntry{version: lr.Version, rule: r}
		ls.order = append(ls.order, lr.ID)
		c := *r // the compiled rule is shared; its index is this policy's
		if at, ok := fileIndex[lr.ID]; ok {
			c.Index = at
			rules[at] = &c
		} else {
			c.Index = len(rules)
			rules = append(rules, &c)
		}
	}
	return rules
}

// assemble builds ls.ids: those of old, with the identities affected
// assembled again from ls's tiers, their unchanged overrides and fresh,
// the overrides compiled now by identity.
func (p *Policy) assemble(ls, old *layerState, affected map[identity]bool, fresh map[identity][]*override) {
	for d := range ls.ids {
		if old != nil && old.ids[d] != nil {
			ls.ids[d] = maps.Clone(old.ids[d])
		}
	}
	for k := range affected {
		var list []*override
		if old != nil {
			// The overrides it had, unless changed or deleted.
			if oa := old.ids[k.kind][k.value]; oa != nil {
				for _, o := range oa.overrides {
					if e := ls.overrides[o.id]; e != nil && e.o == o {
						list = append(list, o)
					}
				}
			}
		}
		list = append(list, fresh[k]...)
		tier := ls.tiers[k]
		if len(list) == 0 && tier == "" {
			delete(ls.ids[k.kind], k.value)
			continue
		}
		if len(list) > 1 {
			slices.SortFunc(list, func(x, y *override) int {
				return cmp.Or(cmp.Compare(y.version, x.version), strings.Compare(y.id, x.id))
			})
		}
		if ls.ids[k.kind] == nil {
			ls.ids[k.kind] = map[string]*Assignment{}
		}
		ls.ids[k.kind][k.value] = &Assignment{Kind: k.kind, Value: k.value, Tier: tier, layered: true,
			overrides: list, base: p.assignments[k.kind][k.value]}
	}
}

func identityKind(d Dimension) bool { return d == DimClient || d == DimUser || d == DimAPIKey }

// decodeLayerRule decodes lr's spec with the decoder of the file's rules.
func decodeLayerRule(lr *LayerRule, st *settings) (r *Rule, le *LayerError) {
	defer func() {
		// As Parse: a bad spec must not take the process down.
		if v := recover(); v != nil {
			r, le = nil, &LayerError{Object: "rule", ID: lr.ID, Msg: fmt.Sprintf("cannot decode: %v", v)}
		}
	}()
	bad := func(field, msg string) (*Rule, *LayerError) {
		return nil, &LayerError{Object: "rule", ID: lr.ID, Field: field, Msg: msg}
	}
	var doc yaml.Node
	more, err := unmarshal(lr.Spec, &doc)
	if err != nil || more != nil {
		return bad("", "not a JSON object")
	}
	root := resolve(&doc)
	if root != nil && root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = resolve(root.Content[0])
	}
	if root == nil || root.Kind != yaml.MappingNode {
		return bad("", "not a JSON object")
	}
	d := &decoder{file: "rule"}
	tmp := &Policy{}
	d.rules(&yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{root}}, st, tmp)
	if len(d.errs) > 0 {
		var ce *ConfigError
		if !errors.As(d.errs[0], &ce) {
			return bad("", d.errs[0].Error())
		}
		field, msg := ruleField(ce.Msg)
		return bad(field, msg)
	}
	if len(tmp.Rules) != 1 {
		return bad("", "not a rule")
	}
	r = tmp.Rules[0]
	if r.ID != lr.ID {
		return bad("id", fmt.Sprintf("the spec's id %q is not the rule's id", r.ID))
	}
	return r, nil
}

// ruleField splits a message of the rules decoder into the field it names
// and what it says of it: `rule "x".match.resource: "..." bad glob`
// names match.resource; `rule "x": missing limit`, limit.
func ruleField(msg string) (field, rest string) {
	s := msg
	if strings.HasPrefix(s, "rules[0]") {
		s = s[len("rules[0]"):]
	} else if strings.HasPrefix(s, "rule \"") {
		if i := strings.Index(s[6:], "\""); i >= 0 {
			s = s[6+i+1:]
		}
	}
	if rest, ok := strings.CutPrefix(s, "."); ok {
		if f, m, ok := strings.Cut(rest, ": "); ok {
			return f, m
		}
	}
	m := strings.TrimPrefix(s, ": ")
	if f, ok := strings.CutPrefix(m, "missing "); ok && !strings.Contains(f, " ") {
		return f, m
	}
	return "", m
}
