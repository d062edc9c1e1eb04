// A map from strings that versions share: the layer's overrides and
// identities by id, of which one change must not copy the 100,000 others.

package policy

import "hash/maphash"

// idMap is an immutable map from strings to V, split in buckets by the
// key's hash. A version derived from another (see edit) shares the
// buckets it did not change with it, so that changing k keys among n
// copies about k*bucketLoad entries, and a lookup stays one hash and a
// scan of a few entries. The zero value is an empty map. It is safe for
// concurrent reads.
type idMap[V any] struct {
	seed    maphash.Seed
	buckets [][]idEntry[V] // a power of two of them
	n       int
}

type idEntry[V any] struct {
	hash uint64
	key  string
	v    V
}

// bucketLoad is the number of entries per bucket that the bucket count
// aims at: small buckets make a change cheap to copy and a lookup short.
const bucketLoad = 8

// get returns the value of k.
func (m *idMap[V]) get(k string) (V, bool) {
	if len(m.buckets) != 0 {
		h := maphash.String(m.seed, k)
		for _, e := range m.buckets[h&uint64(len(m.buckets)-1)] {
			if e.hash == h && e.key == k {
				return e.v, true
			}
		}
	}
	var zero V
	return zero, false
}

// len returns the number of entries.
func (m *idMap[V]) len() int { return m.n }

// all calls f for every entry, in no order, until f returns false.
func (m *idMap[V]) all(f func(string, V) bool) {
	for _, b := range m.buckets {
		for _, e := range b {
			if !f(e.key, e.v) {
				return
			}
		}
	}
}

// idMapEdit builds a new version of an idMap; the map it started from is
// not modified.
type idMapEdit[V any] struct {
	m     idMap[V]
	owned []bool // the buckets copied already, which the edit may modify
}

// edit starts a new version of m sized for about n entries. When m's
// buckets do not suit n, the new version is built again from m's entries.
func (m *idMap[V]) edit(n int) *idMapEdit[V] {
	want := 1
	for want*bucketLoad < n {
		want *= 2
	}
	if len(m.buckets) == 0 || len(m.buckets) > 4*want || 4*len(m.buckets) < want {
		e := newIDMap[V](maphash.MakeSeed(), n)
		m.all(func(k string, v V) bool {
			e.set(k, v)
			return true
		})
		return e
	}
	e := &idMapEdit[V]{}
	e.m = idMap[V]{seed: m.seed, buckets: append([][]idEntry[V](nil), m.buckets...), n: m.n}
	e.owned = make([]bool, len(m.buckets))
	return e
}

// newIDMap starts a new, empty map sized for about n entries, whose keys
// hash with seed (see slotHash).
func newIDMap[V any](seed maphash.Seed, n int) *idMapEdit[V] {
	want := 1
	for want*bucketLoad < n {
		want *= 2
	}
	// The buckets are cut from one array, owned by the edit, with room
	// for half as many entries again as they average: few of them then
	// grow.
	const room = bucketLoad + bucketLoad/2
	e := &idMapEdit[V]{m: idMap[V]{seed: seed, buckets: make([][]idEntry[V], want)}, owned: make([]bool, want)}
	all := make([]idEntry[V], want*room)
	for b := range e.m.buckets {
		e.m.buckets[b] = all[b*room : b*room : (b+1)*room]
		e.owned[b] = true
	}
	return e
}

// bucket returns the bucket of the keys of hash h.
func (e *idMapEdit[V]) bucket(h uint64) int { return int(h & uint64(len(e.m.buckets)-1)) }

// find returns the bucket of k, owned by the edit, and k's index in it
// (-1 when absent).
func (e *idMapEdit[V]) find(k string) (h uint64, b int, i int) {
	h = maphash.String(e.m.seed, k)
	b, i = e.findHash(h, k)
	return h, b, i
}

// findHash is find, for k of hash h.
func (e *idMapEdit[V]) findHash(h uint64, k string) (b int, i int) {
	b = e.bucket(h)
	if !e.owned[b] {
		n := len(e.m.buckets[b]) + 1
		if n == 1 {
			n = bucketLoad // a bucket being filled
		}
		e.m.buckets[b] = append(make([]idEntry[V], 0, n), e.m.buckets[b]...)
		e.owned[b] = true
	}
	for i, x := range e.m.buckets[b] {
		if x.hash == h && x.key == k {
			return b, i
		}
	}
	return b, -1
}

// slot returns where k's value is, adding k (with the zero value) when
// absent, and whether it was there. The pointer is valid until the next
// change of the edit.
func (e *idMapEdit[V]) slot(k string) (*V, bool) {
	v, there := e.slotHash(maphash.String(e.m.seed, k), k)
	if !there {
		e.m.n++
	}
	return v, there
}

// slotHash is slot, for k of hash h under the map's seed, but leaves the
// count of entries to the caller (see added). Calls for keys of
// different buckets may run at once.
func (e *idMapEdit[V]) slotHash(h uint64, k string) (*V, bool) {
	b, i := e.findHash(h, k)
	if i >= 0 {
		return &e.m.buckets[b][i].v, true
	}
	e.m.buckets[b] = append(e.m.buckets[b], idEntry[V]{hash: h, key: k})
	return &e.m.buckets[b][len(e.m.buckets[b])-1].v, false
}

// added counts n entries added by slotHash.
func (e *idMapEdit[V]) added(n int) { e.m.n += n }

// get returns the value of k in the version being built.
func (e *idMapEdit[V]) get(k string) (V, bool) { return e.m.get(k) }

// set sets k to v, and returns k's former value, if any.
func (e *idMapEdit[V]) set(k string, v V) (old V, ok bool) {
	h, b, i := e.find(k)
	if i >= 0 {
		old, e.m.buckets[b][i].v = e.m.buckets[b][i].v, v
		return old, true
	}
	e.m.buckets[b] = append(e.m.buckets[b], idEntry[V]{hash: h, key: k, v: v})
	e.m.n++
	return old, false
}

// delete removes k.
func (e *idMapEdit[V]) delete(k string) {
	_, b, i := e.find(k)
	if i < 0 {
		return
	}
	bk := e.m.buckets[b]
	bk[i] = bk[len(bk)-1]
	bk[len(bk)-1] = idEntry[V]{}
	e.m.buckets[b] = bk[:len(bk)-1]
	e.m.n--
}

// done returns the new version; the edit must not be used afterwards.
func (e *idMapEdit[V]) done() idMap[V] { return e.m }
