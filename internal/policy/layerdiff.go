// The layer's identities and overrides, applied by their difference with
// the previous apply's: the control plane sends the whole layer at every
// change, and one change among 100,000 overrides must neither compile nor
// copy the others.

package policy

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
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

// overridesAll applies l's overrides as a whole, reusing old's compiled
// ones whose id, version, identity and tier are unchanged and whose rules'
// limits are (always, when rulesSame), and assembles every identity.
// Overrides in the order of their ids, as the control plane sends them,
// are found by a binary search of that order; others by a map. The
// overrides are compiled on several goroutines when they are many.
func (ls *layerState) overridesAll(p *Policy, l *Layer, old *layerState, rulesSame bool, st *settings, fail func(*LayerError)) {
	los := l.Overrides
	ls.sorted = increasing(los, "", "")
	type result struct {
		e  *overrideEntry
		le *LayerError
	}
	res := make([]result, len(los))
	parallel(len(los), func(from, to int) {
		oc := &overrideCompiler{st: st, byID: ls.byID, many: true}
		j := 0 // old's override of the id, when both are in order
		if old != nil && ls.sorted && old.sorted && from < to {
			j, _ = slices.BinarySearchFunc(old.ovs, los[from].ID, compareID)
		}
		for i := from; i < to; i++ {
			lo := &los[i]
			if !identityKind(lo.Kind) || lo.Value == "" {
				res[i].le = &LayerError{Object: "override", ID: lo.ID, Field: "kind", Msg: "want a client, user or api_key with a value"}
				continue
			}
			k := identity{lo.Kind, lo.Value}
			tier := ls.tierFor(p, k)
			if old != nil {
				var oe *overrideEntry
				if ls.sorted && old.sorted {
					for j < len(old.ovs) && old.ovs[j].o.id < lo.ID {
						j++
					}
					if j < len(old.ovs) && old.ovs[j].o.id == lo.ID {
						oe = old.ovs[j]
					}
				} else {
					oe = old.override(lo.ID)
				}
				if oe != nil && oe.o.version == lo.Version && oe.who == k && oe.tier == tier && (rulesSame || oe.o.sameParents(ls.byID, tier)) {
					res[i].e = oe
					continue
				}
			}
			var one [1]ruleLimit
			res[i].e, res[i].le = oc.compile(k, lo.ID, lo.Version, lo.ExpiresAt, layerLimits(lo, one[:0]), tier)
		}
	})

	// The indexes, in the layer's order, which decides which of two
	// overrides of one id is the duplicate.
	var ed *idMapEdit[*overrideEntry]
	if !ls.sorted {
		ed = (&idMap[*overrideEntry]{}).edit(len(los))
	}
	ls.ovs = make([]*overrideEntry, 0, len(los))
	var ids [DimGlobal + 1]*idMapEdit[*Assignment]
	var as assignmentSlab
	for i := range los {
		if ed != nil {
			slot, dup := ed.slot(los[i].ID)
			if dup {
				fail(&LayerError{Object: "override", ID: los[i].ID, Field: "id", Msg: "duplicate override id"})
				continue
			}
			*slot = res[i].e
		}
		if res[i].le != nil {
			fail(res[i].le)
			continue
		}
		e := res[i].e
		ls.ovs = append(ls.ovs, e)
		k := e.who
		if ids[k.kind] == nil {
			ids[k.kind] = (&idMap[*Assignment]{}).edit(len(los) / 2)
		}
		a, _ := ids[k.kind].slot(k.value)
		if *a == nil {
			*a = as.new(ls.view(p, k, nil))
		}
		(*a).overrides = insertOverride((*a).overrides, e.o)
	}
	if ed != nil {
		ls.overrides = ed.done()
	}
	for d := range ls.ids {
		kind := Dimension(d)
		ls.tiers[d].all(func(v, _ string) bool {
			if ids[d] == nil {
				ids[d] = (&idMap[*Assignment]{}).edit(ls.tiers[d].len())
			}
			if a, _ := ids[d].slot(v); *a == nil {
				*a = as.new(ls.view(p, identity{kind, v}, nil))
			}
			return true
		})
		if ids[d] != nil {
			ls.ids[d] = ids[d].done()
		}
	}
}

// parallelMin is the number of items below which parallel does not start
// another goroutine.
const parallelMin = 512

// parallel calls f on consecutive ranges [from, to) covering [0, n): on up
// to GOMAXPROCS goroutines at once, each given parallelMin items or more,
// and returns once every call has returned.
func parallel(n int, f func(from, to int)) {
	w := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if w <= 1 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for i := range w {
		wg.Go(func() { f(i*n/w, (i+1)*n/w) })
	}
	wg.Wait()
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

// assignmentSlab allocates the assignments of a whole apply 64 at a time,
// each with room for its first two overrides: an identity's assignment
// and its list of overrides then cost no allocation of their own. An
// assignment that later applies keep keeps its 63 neighbours alive too.
type assignmentSlab []roomyAssignment

type roomyAssignment struct {
	a    Assignment
	room [2]*override
}

// new returns a copy of a from the slab; its overrides, when it has none,
// are the room that comes with it.
func (s *assignmentSlab) new(a Assignment) *Assignment {
	if len(*s) == 0 {
		*s = make([]roomyAssignment, 64)
	}
	ra := &(*s)[0]
	*s = (*s)[1:]
	ra.a = a
	if ra.a.overrides == nil {
		ra.a.overrides = ra.room[:0]
	}
	return &ra.a
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
