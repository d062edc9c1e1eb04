// The layer's identities and overrides, applied by their difference with
// the previous apply's: the control plane sends the whole layer at every
// change, and one change among 100,000 overrides must neither compile nor
// copy the others.

package policy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The numbers of identities and of overrides, changed, added or removed,
// above which they are applied as a whole rather than by their difference
// (which looks each of them up).
const (
	maxTierDiff     = 16
	maxOverrideDiff = 1024
)

// middle returns the lengths of the longest common prefix and suffix of
// two sequences of lengths n and on whose elements at i and j are
// same(i, j), the suffix not overlapping the prefix.
func middle(n, on int, same func(i, j int) bool) (pre, suf int) {
	for pre < n && pre < on && same(pre, pre) {
		pre++
	}
	for suf < n-pre && suf < on-pre && same(n-1-suf, on-1-suf) {
		suf++
	}
	return pre, suf
}

// tierFor returns the tier of identity k: the layer's, else that of the
// file's first assignment of k, else the default one.
func (ls *layerState) tierFor(p *Policy, k identity) string {
	if t, _ := ls.tiers[k.kind].get(k.value); t != "" {
		return t
	}
	if as := p.assignments[k.kind][k.value]; len(as) > 0 && as[0].Tier != "" {
		return as[0].Tier
	}
	return ls.st.defaultTier
}

// validIdentity reports whether li is an identity with a known tier.
func (ls *layerState) validIdentity(li *LayerIdentity, fail func(*LayerError)) bool {
	if !identityKind(li.Kind) || li.Value == "" {
		fail(&LayerError{Object: "identity", ID: li.Kind.String() + ":" + li.Value, Field: "kind", Msg: "want a client, user or api_key with a value"})
		return false
	}
	if _, ok := ls.st.tiers[li.Tier]; !ok {
		fail(&LayerError{Object: "identity", ID: li.Kind.String() + ":" + li.Value, Field: "tier", Msg: fmt.Sprintf("unknown tier %q", li.Tier)})
		return false
	}
	return true
}

// layerTiers records l's identities' tiers in ls (the last of an
// identity's applies), and returns the identities whose tier differs from
// old's (none without old).
func (ls *layerState) layerTiers(l *Layer, old *layerState, fail func(*LayerError)) []identity {
	ids := l.Identities
	if old != nil && slices.Equal(old.idents, ids) {
		ls.idents, ls.tiers = old.idents, old.tiers
		return nil
	}
	ls.idents = slices.Clone(ids)
	if old != nil {
		pre, suf := middle(len(ids), len(old.idents), func(i, j int) bool { return ids[i] == old.idents[j] })
		if len(ids)+len(old.idents)-2*(pre+suf) <= maxTierDiff {
			return ls.tiersChanged(ids, old, pre, suf, fail)
		}
	}
	var eds [DimGlobal + 1]*idMapEdit[string]
	for i := range ids {
		li := &ids[i]
		if !ls.validIdentity(li, fail) {
			continue
		}
		if eds[li.Kind] == nil {
			eds[li.Kind] = (&idMap[string]{}).edit(len(ids))
		}
		eds[li.Kind].set(li.Value, ls.st.tierName(li.Tier))
	}
	for d, ed := range eds {
		if ed != nil {
			ls.tiers[d] = ed.done()
		}
	}
	if old == nil {
		return nil
	}
	var changed []identity
	for d := range ls.tiers {
		kind := Dimension(d)
		ls.tiers[d].all(func(v, t string) bool {
			if ot, _ := old.tiers[d].get(v); ot != t {
				changed = append(changed, identity{kind, v})
			}
			return true
		})
		old.tiers[d].all(func(v, _ string) bool {
			if _, ok := ls.tiers[d].get(v); !ok {
				changed = append(changed, identity{kind, v})
			}
			return true
		})
	}
	return changed
}

// tiersChanged is layerTiers when ids differ from old's in
// ids[pre:len(ids)-suf] only, and few of them.
func (ls *layerState) tiersChanged(ids []LayerIdentity, old *layerState, pre, suf int, fail func(*LayerError)) []identity {
	keys := map[identity]bool{}
	for i := pre; i < len(ids)-suf; i++ {
		if ls.validIdentity(&ids[i], fail) {
			keys[identity{ids[i].Kind, ids[i].Value}] = true
		}
	}
	for _, li := range old.idents[pre : len(old.idents)-suf] {
		keys[identity{li.Kind, li.Value}] = true
	}
	ls.tiers = old.tiers
	var eds [DimGlobal + 1]*idMapEdit[string]
	var changed []identity
	for k := range keys {
		t := ""
		for i := len(ids) - 1; i >= 0; i-- {
			if ids[i].Kind == k.kind && ids[i].Value == k.value {
				t = ls.st.tierName(ids[i].Tier)
				break
			}
		}
		if ot, _ := old.tiers[k.kind].get(k.value); ot == t {
			continue
		}
		if eds[k.kind] == nil {
			eds[k.kind] = old.tiers[k.kind].edit(len(ids))
		}
		if t == "" {
			eds[k.kind].delete(k.value)
		} else {
			eds[k.kind].set(k.value, t)
		}
		changed = append(changed, k)
	}
	for d, ed := range eds {
		if ed != nil {
			ls.tiers[d] = ed.done()
		}
	}
	return changed
}

// sameOverride reports whether lo has the id, version and identity of e.
func sameOverride(lo *LayerOverride, e *overrideEntry) bool {
	return lo.ID == e.o.id && lo.Version == e.o.version && lo.Kind == e.who.kind && lo.Value == e.who.value
}

// override returns the compiled override id; nil when there is none.
func (ls *layerState) override(id string) *overrideEntry {
	if ls.sorted {
		if i, ok := slices.BinarySearchFunc(ls.ovs, id, compareID); ok {
			return ls.ovs[i]
		}
		return nil
	}
	e, _ := ls.overrides.get(id)
	return e
}

func compareID(e *overrideEntry, id string) int { return strings.Compare(e.o.id, id) }

// increasing reports whether the ids of los increase strictly, from after
// lo (when not "") to before hi (when not "").
func increasing(los []LayerOverride, lo, hi string) bool {
	for i := range los {
		if i == 0 && lo != "" && los[i].ID <= lo || i > 0 && los[i].ID <= los[i-1].ID {
			return false
		}
	}
	return len(los) == 0 || hi == "" || los[len(los)-1].ID < hi
}

// overridesChanged applies l's overrides by their difference with old's,
// and reports false, having recorded nothing, when the difference is too
// large to be worth it: the overrides changed, added and removed are
// compiled, and so are those of the identities whose tier changed and
// those whose rules' limits changed (unless rulesSame); the identities
// they belong to are assembled again.
func (ls *layerState) overridesChanged(p *Policy, l *Layer, old *layerState, rulesSame bool, tierChanged []identity, oc *overrideCompiler, fail func(*LayerError)) bool {
	los := l.Overrides
	pre, suf := middle(len(los), len(old.ovs), func(i, j int) bool { return sameOverride(&los[i], old.ovs[j]) })
	newMid, oldMid := los[pre:len(los)-suf], old.ovs[pre:len(old.ovs)-suf]
	if len(newMid)+len(oldMid) > maxOverrideDiff {
		return false
	}
	// The overrides kept whose rules' limits changed, by their position
	// in old.ovs.
	var stale []int
	if !rulesSame {
		for _, r := range [2][2]int{{0, pre}, {len(old.ovs) - suf, len(old.ovs)}} {
			for j := r[0]; j < r[1]; j++ {
				e := old.ovs[j]
				if !old.sorted {
					e = old.override(e.o.id)
				}
				if !e.o.sameParents(ls.byID, e.tier) {
					stale = append(stale, j)
				}
			}
		}
		if len(newMid)+len(oldMid)+len(stale) > maxOverrideDiff {
			return false
		}
	}
	if old.sorted {
		var lo, hi string
		if pre > 0 {
			lo = los[pre-1].ID
		}
		if suf > 0 {
			hi = los[len(los)-suf].ID
		}
		if !increasing(newMid, lo, hi) {
			return false // out of order now: indexed by a map from now on
		}
	}
	ls.sorted = old.sorted
	var ed *idMapEdit[*overrideEntry]
	if !ls.sorted {
		ed = old.overrides.edit(len(los))
	}
	// affected are the identities to assemble again, with the overrides
	// they gained.
	affected := map[identity][]string{}
	touch := func(k identity) {
		if _, ok := affected[k]; !ok {
			affected[k] = nil
		}
	}
	inOldMid := make(map[string]bool, len(oldMid))
	for _, e := range oldMid {
		inOldMid[e.o.id] = true
	}
	seen := make(map[string]bool, len(newMid))
	mid := make([]*overrideEntry, 0, len(newMid))
	for i := range newMid {
		lo := &newMid[i]
		cur := old.override(lo.ID)
		if seen[lo.ID] || cur != nil && !inOldMid[lo.ID] {
			// The other is among the new ones, or among those unchanged.
			fail(&LayerError{Object: "override", ID: lo.ID, Field: "id", Msg: "duplicate override id"})
			continue
		}
		seen[lo.ID] = true
		if !identityKind(lo.Kind) || lo.Value == "" {
			fail(&LayerError{Object: "override", ID: lo.ID, Field: "kind", Msg: "want a client, user or api_key with a value"})
			continue
		}
		k := identity{lo.Kind, lo.Value}
		tier := ls.tierFor(p, k)
		if cur != nil && cur.o.version == lo.Version && cur.who == k && cur.tier == tier && (rulesSame || cur.o.sameParents(ls.byID, tier)) {
			mid = append(mid, cur) // moved, not changed
			continue
		}
		e, le := oc.compile(k, lo.ID, lo.Version, lo.ExpiresAt, layerLimits(lo, nil), tier)
		if le != nil {
			fail(le)
			continue
		}
		if ed != nil {
			ed.set(lo.ID, e)
		}
		mid = append(mid, e)
		affected[k] = append(affected[k], lo.ID)
		if cur != nil {
			touch(cur.who)
		}
	}
	for _, e := range oldMid {
		if !seen[e.o.id] {
			if ed != nil {
				ed.delete(e.o.id)
			}
			touch(e.who)
		}
	}
	ls.ovs = make([]*overrideEntry, 0, len(los))
	ls.ovs = append(ls.ovs, old.ovs[:pre]...)
	ls.ovs = append(ls.ovs, mid...)
	ls.ovs = append(ls.ovs, old.ovs[len(old.ovs)-suf:]...)

	// The overrides kept whose rules' limits changed, compiled again for
	// their identity's tier now.
	for _, j := range stale {
		e := old.ovs[j]
		if !old.sorted {
			e = old.override(e.o.id)
		}
		ne, le := oc.compile(e.who, e.o.id, e.o.version, e.o.expiresAt, e.o.limits, ls.tierFor(p, e.who))
		if le != nil {
			fail(le)
			continue
		}
		if ed != nil {
			ed.set(e.o.id, ne)
		} else {
			if j >= pre {
				j += len(los) - len(old.ovs) // in the suffix
			}
			ls.ovs[j] = ne
		}
		touch(e.who)
	}

	// The overrides of identities whose tier changed inherit from other
	// limits now.
	for _, k := range tierChanged {
		touch(k)
		oa, _ := old.ids[k.kind].get(k.value)
		if oa == nil {
			continue
		}
		tier := ls.tierFor(p, k)
		for _, o := range oa.overrides {
			var e *overrideEntry
			at := -1
			if ed != nil {
				e, _ = ed.get(o.id)
			} else if i, ok := slices.BinarySearchFunc(ls.ovs, o.id, compareID); ok {
				e, at = ls.ovs[i], i
			}
			if e == nil || e.who != k || e.tier == tier {
				continue
			}
			ne, le := oc.compile(k, o.id, o.version, o.expiresAt, o.limits, tier)
			if le != nil {
				fail(le)
				continue
			}
			if ed != nil {
				ed.set(o.id, ne)
			} else {
				ls.ovs[at] = ne
			}
		}
	}
	if ed != nil {
		ls.overrides = ed.done()
	}

	// The identities affected, assembled again from their overrides
	// unchanged and those they gained.
	ls.ids = old.ids
	var eds [DimGlobal + 1]*idMapEdit[*Assignment]
	for k, gained := range affected {
		var ids []string
		if oa, _ := old.ids[k.kind].get(k.value); oa != nil {
			for _, o := range oa.overrides {
				ids = append(ids, o.id)
			}
		}
		ids = append(ids, gained...)
		slices.Sort(ids)
		var list []*override
		for _, id := range slices.Compact(ids) {
			if e := ls.override(id); e != nil && e.who == k {
				list = append(list, e.o)
			}
		}
		if eds[k.kind] == nil {
			eds[k.kind] = old.ids[k.kind].edit(old.ids[k.kind].len() + len(affected))
		}
		if a := ls.assignment(p, k, list, false); a != nil {
			eds[k.kind].set(k.value, a)
		} else {
			eds[k.kind].delete(k.value)
		}
	}
	for d, ed := range eds {
		if ed != nil {
			ls.ids[d] = ed.done()
		}
	}
	return true
}

// assignment returns the layer's view of identity k with the overrides
// list (in any order; sorted here): nil when k has neither a layer tier
// nor an override, unless always.
func (ls *layerState) assignment(p *Policy, k identity, list []*override, always bool) *Assignment {
	a := ls.view(p, k, list)
	if len(list) == 0 && a.Tier == "" && !always {
		return nil
	}
	return &a
}

// view returns the layer's view of identity k with the overrides list (in
// any order; sorted here).
func (ls *layerState) view(p *Policy, k identity, list []*override) Assignment {
	tier, _ := ls.tiers[k.kind].get(k.value)
	sortOverrides(list)
	return Assignment{Kind: k.kind, Value: k.value, Tier: tier, layered: true,
		overrides: list, base: p.assignments[k.kind][k.value]}
}

// sortOverrides sorts an identity's overrides newest first: by version,
// then id, decreasing.
func sortOverrides(list []*override) {
	if len(list) > 1 {
		slices.SortFunc(list, newer)
	}
}

func newer(x, y *override) int {
	return cmp.Or(cmp.Compare(y.version, x.version), strings.Compare(y.id, x.id))
}

// insertOverride inserts o into list, sorted as sortOverrides sorts it:
// an identity has few overrides.
func insertOverride(list []*override, o *override) []*override {
	i := len(list)
	for i > 0 && newer(o, list[i-1]) < 0 {
		i--
	}
	return slices.Insert(list, i, o)
}
