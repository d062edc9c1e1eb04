// Applying the control plane's layer to the file's policy: the layer's
// rules decoded as the file's, identities' tiers, overrides compiled on a
// typed path, and throttles; what did not change since the previous apply
// is reused, not compiled again.

package policy

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// for it, to be reused by the next WithLayer. It is never modified once
// built: the next one shares what did not change.
type layerState struct {
	revision int64
	region   string
	st       *settings // the file's, which compiled what is cached
	// rules are the layer's rules in its order, compiled; byID the
	// policy's rules by id.
	rules []ruleEntry
	byID  map[string]*Rule
	// idents are the layer's identities as given, and tiers their tiers
	// by kind and value.
	idents []LayerIdentity
	tiers  [DimGlobal + 1]idMap[string]
	// ovs are the layer's overrides in its order, for the next apply to
	// tell what changed by their id, version and identity. When sorted,
	// their ids increase and ovs is their index; otherwise overrides is,
	// and an entry of ovs may be one compiled for a former tier.
	ovs       []*overrideEntry
	sorted    bool
	overrides idMap[*overrideEntry]
	// ids are the identities the layer names, with their tier and
	// overrides, by kind and value.
	ids       [DimGlobal + 1]idMap[*Assignment]
	throttles throttles
	cuts      *cutCache
}

type ruleEntry struct {
	id   string
	spec []byte // a copy of the spec it was compiled from
	rule *Rule  // as compiled, with the index of the policy it was compiled for
}

// identity is one identity, by kind and value.
type identity struct {
	kind  Dimension
	value string
}

// overrideEntry is a compiled override, with the identity and the tier it
// was compiled for. o points into the entry, allocated with it.
type overrideEntry struct {
	who  identity
	tier string
	o    *override
	ov   override
	one  [1]ruleLimit // ov's limits, when it has one
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
			if l, ok := o.limit(r.ID); ok && o.active(now) {
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
// WithLayer (may be nil), lends what did not change, compiled already:
// the rules whose spec is unchanged, the overrides whose id and version
// are unchanged, and its indexes of identities and overrides, of which
// only the entries that changed are copied. A change of a few objects
// among 100,000 thus applies in milliseconds: what remains in proportion
// to their number is comparing the layer with prev's, in order, and
// copying one slice of pointers.
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
	rulesSame := old != nil && len(old.rules) == len(l.Rules)
	for i := 0; rulesSame && i < len(l.Rules); i++ {
		rulesSame = old.rules[i].id == l.Rules[i].ID && bytes.Equal(old.rules[i].spec, l.Rules[i].Spec)
	}
	var rules []*Rule
	var m *matcher
	var matching sync.WaitGroup
	if rulesSame {
		rules, m, ls.rules, ls.byID = prev.Rules, prev.matcher, old.rules, old.byID
	} else {
		rules = p.layerRules(l, old, ls, fail)
		ls.byID = make(map[string]*Rule, len(rules))
		for _, r := range rules {
			ls.byID[r.ID] = r
		}
		// Their matcher is built beside the identities and overrides,
		// which do not need it, on a core they leave idle at times.
		matching.Go(func() { m = newMatcher(rules) })
	}

	// Identities and overrides: those that changed since prev are
	// compiled, and the identities they belong to assembled again.
	changed := ls.layerTiers(l, old, fail)
	if old == nil || !ls.overridesChanged(p, l, old, rulesSame, changed, &overrideCompiler{st: st, byID: ls.byID}, fail) {
		ls.overridesAll(p, l, old, rulesSame, st, fail)
	}
	matching.Wait()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

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

// layerRules returns the file's rules with l's applied, compiling those
// whose spec is not one of old's, and records them in ls.
func (p *Policy) layerRules(l *Layer, old *layerState, ls *layerState, fail func(*LayerError)) []*Rule {
	ls.rules = make([]ruleEntry, 0, len(l.Rules))
	var compiled map[string]*ruleEntry
	if old != nil {
		compiled = make(map[string]*ruleEntry, len(old.rules))
		for i := range old.rules {
			compiled[old.rules[i].id] = &old.rules[i]
		}
	}
	fileIndex := make(map[string]int, len(p.Rules))
	for i, r := range p.Rules {
		fileIndex[r.ID] = i
	}
	// The rules not compiled already, decoded on several goroutines when
	// they are many.
	decoded := make([]struct {
		r  *Rule
		le *LayerError
	}, len(l.Rules))
	parallel(len(l.Rules), func() func(from, to int) {
		var sc ruleScratch
		return func(from, to int) {
			for i := from; i < to; i++ {
				lr := &l.Rules[i]
				if c := compiled[lr.ID]; c == nil || !bytes.Equal(c.spec, lr.Spec) {
					decoded[i].r, decoded[i].le = decodeLayerRuleWith(lr, ls.st, true, &sc)
				}
			}
		}
	})
	ids := make(map[string]struct{}, len(l.Rules))
	rules := slices.Clone(p.Rules)
	for i := range l.Rules {
		lr := &l.Rules[i]
		if _, dup := ids[lr.ID]; dup {
			fail(&LayerError{Object: "rule", ID: lr.ID, Field: "id", Msg: "duplicate rule id"})
			continue
		}
		ids[lr.ID] = struct{}{}
		var e ruleEntry
		var c *Rule
		if cached := compiled[lr.ID]; cached != nil && bytes.Equal(cached.spec, lr.Spec) {
			// The compiled rule is shared; its index is this policy's.
			e, c = *cached, new(Rule)
			*c = *cached.rule
		} else {
			if le := decoded[i].le; le != nil {
				fail(le)
				continue
			}
			e = ruleEntry{id: lr.ID, spec: bytes.Clone(lr.Spec), rule: decoded[i].r}
			c = e.rule // compiled for this policy
		}
		ls.rules = append(ls.rules, e)
		if at, ok := fileIndex[lr.ID]; ok {
			c.Index = at
			rules[at] = c
		} else {
			c.Index = len(rules)
			rules = append(rules, c)
		}
	}
	return rules
}

func identityKind(d Dimension) bool { return d == DimClient || d == DimUser || d == DimAPIKey }

// decodeLayerRule decodes lr's spec with the decoder of the file's rules.
func decodeLayerRule(lr *LayerRule, st *settings) (r *Rule, le *LayerError) {
	return decodeLayerRuleWith(lr, st, true, nil)
}

// ruleScratch is what the decoding of several layer rules, one after the
// other, shares: a slab of nodes (see jsonNode), and the limits compiled
// so far (see decoder.shared).
type ruleScratch struct {
	slab   []yaml.Node
	limits map[sharedLimit]*Limit
}

// decodeLayerRuleWith is decodeLayerRule, reading a JSON spec without
// yaml.v3 when fast is set and the spec allows it. With sc (may be nil),
// it reads into nodes from sc's slab, of which the rule keeps none, and
// the rule shares the limits it has in common with the rules decoded with
// sc before.
func decodeLayerRuleWith(lr *LayerRule, st *settings, fast bool, sc *ruleScratch) (r *Rule, le *LayerError) {
	defer func() {
		// As Parse: a bad spec must not take the process down.
		if v := recover(); v != nil {
			r, le = nil, &LayerError{Object: "rule", ID: lr.ID, Msg: fmt.Sprintf("cannot decode: %v", v)}
		}
	}()
	bad := func(field, msg string) (*Rule, *LayerError) {
		return nil, &LayerError{Object: "rule", ID: lr.ID, Field: field, Msg: msg}
	}
	doc, ok := (*yaml.Node)(nil), false
	d := &decoder{file: "rule"}
	var slab *[]yaml.Node
	if sc != nil {
		if sc.limits == nil {
			sc.limits = map[sharedLimit]*Limit{}
		}
		slab, d.shared = &sc.slab, sc.limits
	}
	if fast {
		doc, ok = jsonNode(lr.Spec, slab)
	}
	if !ok {
		doc = &yaml.Node{}
		more, err := unmarshal(lr.Spec, doc)
		if err != nil || more != nil {
			return bad("", "not a JSON object")
		}
	}
	root := resolve(doc)
	if root != nil && root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = resolve(root.Content[0])
	}
	if root == nil || root.Kind != yaml.MappingNode {
		return bad("", "not a JSON object")
	}
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
	// The spec's nodes place errors in a file; a layer rule's errors name
	// its fields instead, and the policy need not keep the nodes.
	forget := func(l *Limit) {
		if l != nil && l.src != nil {
			l.src.spec.node = nil
		}
	}
	forget(r.Base)
	for _, l := range r.byTier {
		forget(l)
	}
	return r, nil
}

// ruleField splits a message of the rules decoder into the field it names
// and what it says of it: `rule "x".match.resource: "..." bad glob`
// names match.resource; `rule "x": missing limit` and `rule "x": missing
// window: ...`, limit and window.
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
	if f, ok := strings.CutPrefix(m, "missing "); ok {
		if f, _, _ = strings.Cut(f, ":"); !strings.Contains(f, " ") {
			return f, m
		}
	}
	return "", m
}
