// The typed compile path of the layer's overrides.

package policy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// override is a compiled LayerOverride.
type override struct {
	id        string
	version   int64
	expiresAt time.Time
	// limits are by rule id, sorted: an override names few rules, and a
	// short slice is both smaller and quicker to search than a map.
	limits []ruleLimit
}

// ruleLimit is an override's limit of one rule: as written, as compiled,
// and the rule's limit it inherited from.
type ruleLimit struct {
	rule   string
	ll     LayerLimit
	l      *Limit
	parent *Limit
}

func (o *override) active(now time.Time) bool {
	return o.expiresAt.IsZero() || now.Before(o.expiresAt)
}

// limit returns the override's limit of the rule id.
func (o *override) limit(id string) (*Limit, bool) {
	if len(o.limits) <= 8 {
		for i := range o.limits {
			if o.limits[i].rule == id {
				return o.limits[i].l, true
			}
		}
		return nil, false
	}
	i, ok := slices.BinarySearchFunc(o.limits, id, func(rl ruleLimit, id string) int { return strings.Compare(rl.rule, id) })
	if !ok {
		return nil, false
	}
	return o.limits[i].l, true
}

// sameParents reports whether the rules of o's limits would still have
// them inherit from the same compiled limits under tier.
func (o *override) sameParents(byID map[string]*Rule, tier string) bool {
	for _, rl := range o.limits {
		r := byID[rl.rule]
		if r == nil || r.LimitFor(tier, nil) != rl.parent {
			return false
		}
	}
	return true
}

// overrideCompiler compiles the overrides of one apply. Overrides whose
// limits come out equal (algorithm, limit, window, burst, and the rule's
// quantum, failure mode and instances) share one compiled limit: compiled
// limits are immutable, and many identities get the same few values.
type overrideCompiler struct {
	st    *settings
	byID  map[string]*Rule
	rules map[string]*ruleInfo
	cache map[overrideKey]*Limit
	// many is set when the compiler compiles a whole layer's overrides:
	// it then allocates their entries entrySlab at a time, in slab.
	many bool
	slab []overrideEntry
}

// entrySlab is the number of override entries allocated at once when many
// are compiled: one allocation instead of 64. An entry that later applies
// keep keeps its 63 neighbours alive too, no more.
const entrySlab = 64

// newEntry returns a zero entry.
func (c *overrideCompiler) newEntry() *overrideEntry {
	if !c.many {
		return new(overrideEntry)
	}
	if len(c.slab) == 0 {
		c.slab = make([]overrideEntry, entrySlab)
	}
	e := &c.slab[0]
	c.slab = c.slab[1:]
	return e
}

// ruleInfo is what compiling overrides asks of a rule, kept as they ask:
// its failure mode and instances, the limits it applies by tier, and the
// quantum of its limits by algorithm and window. Overrides name rules at
// random, and 10,000 rules' infos do not stay in a core's cache: the
// fields an override reads, with the first limit and quantum asked (most
// rules are asked for few), fill the info's first 64 bytes, so that one
// cache line answers most overrides.
type ruleInfo struct {
	fm                    FailureMode
	hasParent, hasQuantum bool
	instances             int64
	first                 tierLimit
	firstQ                quantum
	r                     *Rule
	parents               []tierLimit // after the first
	quanta                []quantum   // after the first
}

type tierLimit struct {
	tier string
	l    *Limit
}

type quantum struct {
	alg    sluice.Algorithm
	window time.Duration
	q      int64
}

// rule returns what c knows of the rule id; nil when there is none.
func (c *overrideCompiler) rule(id string) *ruleInfo {
	ri := c.rules[id]
	if ri == nil {
		r := c.byID[id]
		if r == nil {
			return nil
		}
		if c.rules == nil {
			c.rules = map[string]*ruleInfo{}
		}
		ri = &ruleInfo{r: r, fm: r.FailureMode, instances: r.ExpectedInstances}
		// The key is a copy: the keys of the map are then together in
		// memory, not each in the override that named the rule first.
		c.rules[strings.Clone(id)] = ri
	}
	return ri
}

func (ri *ruleInfo) parent(tier string) *Limit {
	if ri.hasParent && ri.first.tier == tier {
		return ri.first.l
	}
	for _, p := range ri.parents {
		if p.tier == tier {
			return p.l
		}
	}
	l := ri.r.LimitFor(tier, nil)
	if !ri.hasParent {
		ri.first, ri.hasParent = tierLimit{tier, l}, true
	} else {
		ri.parents = append(ri.parents, tierLimit{tier, l})
	}
	return l
}

func (ri *ruleInfo) quantum(alg sluice.Algorithm, w time.Duration) int64 {
	if ri.hasQuantum && ri.firstQ.alg == alg && ri.firstQ.window == w {
		return ri.firstQ.q
	}
	for _, q := range ri.quanta {
		if q.alg == alg && q.window == w {
			return q.q
		}
	}
	q := quantumOf(ri.r, alg, w)
	if !ri.hasQuantum {
		ri.firstQ, ri.hasQuantum = quantum{alg, w, q}, true
	} else {
		ri.quanta = append(ri.quanta, quantum{alg, w, q})
	}
	return q
}

// overrideKey is what an override's limit is compiled from: the spec's
// algorithm, limit, window and burst (its other fields are the same for
// every override's), the quantum, and the rule's failure mode and
// instances.
// Its fields are all of 8 bytes, so that it hashes and compares as one
// block of memory.
type overrideKey struct {
	alg, fm                    int64 // a sluice.Algorithm, a FailureMode
	limit, burst, q, instances int64
	window                     time.Duration
}

// compile compiles an override of identity k, of the limits lls (sorted
// by rule id), for an identity of tier, on the typed path: each limit
// inherits the fields it leaves zero from the limit the rule applies to
// the tier, and counts at the quantum of the rule's limits of its
// algorithm and window, so that its key is theirs.
func (c *overrideCompiler) compile(k identity, id string, version int64, expiresAt time.Time, lls []ruleLimit, tier string) (*overrideEntry, *LayerError) {
	bad := func(field, msg string) (*overrideEntry, *LayerError) {
		return nil, &LayerError{Object: "override", ID: id, Field: field, Msg: msg}
	}
	e := c.newEntry()
	e.who, e.tier = k, tier
	o := &e.ov
	e.o = o
	if len(lls) == 1 {
		o.limits = e.one[:] // one allocation for the most common override
	} else {
		o.limits = make([]ruleLimit, len(lls))
	}
	o.id, o.version, o.expiresAt = id, version, expiresAt
	for i, rl := range lls {
		ll := rl.ll
		ri := c.rule(rl.rule)
		if ri == nil {
			return bad("limits."+rl.rule, "unknown rule id")
		}
		r, parent := ri.r, ri.parent(tier)
		if parent == nil && r.GlobalOnly() {
			return bad("limits."+rl.rule, fmt.Sprintf("rule %q has only a global_limit, which an override cannot change", rl.rule))
		}
		if parent == nil {
			return bad("limits."+rl.rule, fmt.Sprintf("rule %q has no limit for tier %q", rl.rule, tier))
		}
		b := parent.Spec
		spec := limitSpec{alg: b.Algorithm, limit: b.Limit, window: b.Window, burst: b.Burst, hasLim: true, hasWin: true, hasBur: b.Burst > 0}
		if ll.Algorithm != "" {
			a, err := sluice.ParseAlgorithm(ll.Algorithm)
			if err != nil {
				return bad("limits."+rl.rule+".algorithm", err.Error())
			}
			spec.alg = a
		}
		switch {
		case ll.Limit < 0 || ll.Limit > sluice.MaxLimit:
			return bad("limits."+rl.rule+".limit", fmt.Sprintf("must be between 1 and %d, got %d", int64(sluice.MaxLimit), ll.Limit))
		case ll.Limit > 0:
			spec.limit = ll.Limit
		}
		switch {
		case ll.Window < 0 || ll.Window > sluice.MaxWindow || ll.Window%time.Microsecond != 0:
			return bad("limits."+rl.rule+".window", fmt.Sprintf("must be a whole number of microseconds up to %s, got %s", sluice.MaxWindow, ll.Window))
		case ll.Window > 0:
			spec.window = ll.Window
		}
		switch {
		case ll.Burst < 0 || ll.Burst > sluice.MaxLimit:
			return bad("limits."+rl.rule+".burst", fmt.Sprintf("must be between 1 and %d, got %d", int64(sluice.MaxLimit), ll.Burst))
		case ll.Burst > 0:
			spec.burst, spec.hasBur = ll.Burst, true
		}
		q := ri.quantum(spec.alg, spec.window)
		k := overrideKey{alg: int64(spec.alg), fm: int64(ri.fm), limit: spec.limit, burst: spec.burst, q: q, instances: ri.instances, window: spec.window}
		l := c.cache[k]
		if l == nil {
			f := "limits." + rl.rule
			d := &decoder{file: "override"}
			if l = d.compile(spec, c.st, ri.fm, ri.instances, f, q); l == nil {
				msg := "cannot be compiled"
				var ce *ConfigError
				if len(d.errs) > 0 && errors.As(d.errs[0], &ce) {
					msg = strings.TrimPrefix(ce.Msg, f+": ")
				}
				return bad(f, msg)
			}
			if c.cache == nil {
				c.cache = map[overrideKey]*Limit{}
			}
			c.cache[k] = l
		}
		o.limits[i] = ruleLimit{rule: rl.rule, ll: ll, l: l, parent: parent}
	}
	return e, nil
}

// quantumOf returns the coarsest quantum of r's limits of algorithm alg
// and window w (1 when none), at which an override of them must count to
// share their keys.
func quantumOf(r *Rule, alg sluice.Algorithm, w time.Duration) int64 {
	q := int64(1)
	add := func(l *Limit) {
		if l != nil && l.Spec.Algorithm == alg && l.Spec.Window == w {
			q = max(q, l.Params[0].Quantum)
		}
	}
	add(r.Base)
	for _, l := range r.byTier {
		add(l)
	}
	return q
}

// layerLimits appends lo's limits to out, sorted by rule id, as compile
// takes them.
func layerLimits(lo *LayerOverride, out []ruleLimit) []ruleLimit {
	for id, ll := range lo.Limits {
		out = append(out, ruleLimit{rule: id, ll: ll})
	}
	slices.SortFunc(out, func(a, b ruleLimit) int { return cmp.Compare(a.rule, b.rule) })
	return out
}
