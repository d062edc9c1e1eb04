// Applying a whole layer's overrides at once, as when there is no previous
// apply to tell what changed: compiled on several goroutines, and the
// identities' index built on several goroutines too, each the owner of
// some of its buckets.

package policy

import (
	"hash/maphash"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// overridesAll applies l's overrides as a whole, reusing old's compiled
// ones whose id, version, identity and tier are unchanged and whose rules'
// limits are (always, when rulesSame), and assembles every identity.
// Overrides in the order of their ids, as the control plane sends them,
// are found by a binary search of that order; others by a map. The
// overrides are compiled on several goroutines when they are many.
func (ls *layerState) overridesAll(p *Policy, l *Layer, old *layerState, rulesSame bool, st *settings, fail func(*LayerError)) {
	los := l.Overrides
	ls.sorted = increasing(los, "", "")
	// seed is that of the identities' index, for the compiling goroutines
	// to hash each override's identity while they read it.
	seed := maphash.MakeSeed()
	type result struct {
		e  *overrideEntry
		h  uint64 // of the identity
		le *LayerError
	}
	res := make([]result, len(los))
	parallel(len(los), func() func(from, to int) {
		oc := &overrideCompiler{st: st, byID: ls.byID, many: true}
		return func(from, to int) {
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
				res[i].h = maphash.String(seed, k.value)
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
		}
	})

	// The overrides in the layer's order, which decides which of two
	// overrides of one id is the duplicate, and their index when they
	// are not in the order of their ids.
	var ed *idMapEdit[*overrideEntry]
	if !ls.sorted {
		ed = (&idMap[*overrideEntry]{}).edit(len(los))
	}
	ls.ovs = make([]*overrideEntry, 0, len(los))
	hashes := make([]uint64, 0, len(los)) // of ls.ovs's identities
	var perKind [DimGlobal + 1]int
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
		ls.ovs = append(ls.ovs, res[i].e)
		hashes = append(hashes, res[i].h)
		perKind[res[i].e.who.kind]++
	}
	if ed != nil {
		ls.overrides = ed.done()
	}
	ls.identitiesAll(p, seed, hashes, perKind)
}

// identitiesAll builds ls.ids, the index of the identities of ls.ovs (of
// which hashes are the identities' hashes under seed, and perKind the
// numbers by kind) and of ls.tiers, each with its tier and its overrides.
// On several goroutines when they are many: the index's buckets are dealt
// in parts, twice as many as goroutines, which take them in turn; each
// part is indexed by reading every override's hash to find its own.
func (ls *layerState) identitiesAll(p *Policy, seed maphash.Seed, hashes []uint64, perKind [DimGlobal + 1]int) {
	var ids [DimGlobal + 1]*idMapEdit[*Assignment]
	for d := range ids {
		if n := perKind[d] + ls.tiers[d].len(); n > 0 {
			ids[d] = newIDMap[*Assignment](seed, min(perKind[d]/2+ls.tiers[d].len(), n))
		}
	}
	workers := max(1, min(runtime.GOMAXPROCS(0), len(hashes)/parallelMin))
	parts := 1
	if workers > 1 {
		parts = 2 * workers
	}
	added := make([][DimGlobal + 1]int, parts)
	index := func(part int, as *assignmentSlab) {
		add := func(k identity, h uint64) *Assignment {
			a, there := ids[k.kind].slotHash(h, k.value)
			if !there {
				*a = as.new(ls.view(p, k, nil))
				added[part][k.kind]++
			}
			return *a
		}
		for i, h := range hashes {
			e := ls.ovs[i]
			if ids[e.who.kind].bucket(h)%parts == part {
				a := add(e.who, h)
				a.overrides = insertOverride(a.overrides, e.o)
			}
		}
		for d := range ls.tiers {
			ls.tiers[d].all(func(v, _ string) bool {
				if h := maphash.String(seed, v); ids[d].bucket(h)%parts == part {
					add(identity{Dimension(d), v}, h)
				}
				return true
			})
		}
	}
	var next atomic.Int64 // the next part
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var as assignmentSlab
			for part := int(next.Add(1)) - 1; part < parts; part = int(next.Add(1)) - 1 {
				index(part, &as)
			}
		})
	}
	wg.Wait()
	for d, ed := range ids {
		if ed != nil {
			for _, n := range added {
				ed.added(n[d])
			}
			ls.ids[d] = ed.done()
		}
	}
}

// parallelMin is the number of items below which parallel does not start
// another goroutine, and parallelChunk the number of items of a range.
const (
	parallelMin   = 512
	parallelChunk = 1024
)

// parallel calls work on consecutive ranges [from, to) of at most
// parallelChunk items covering [0, n), and returns once every call has
// returned. Up to GOMAXPROCS goroutines, each given parallelMin items or
// more, take the ranges in turn, each calling the work function that
// newWorker returned it (and its state). A goroutine that a busy machine
// stops thus delays the others by the range it holds at most, not by its
// share of them all.
func parallel(n int, newWorker func() func(from, to int)) {
	w := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if w <= 1 {
		newWorker()(0, n)
		return
	}
	var next atomic.Int64 // the next range's start
	var wg sync.WaitGroup
	for range w {
		wg.Go(func() {
			work := newWorker()
			for {
				from := int(next.Add(parallelChunk)) - parallelChunk
				if from >= n {
					return
				}
				work(from, min(from+parallelChunk, n))
			}
		})
	}
	wg.Wait()
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
