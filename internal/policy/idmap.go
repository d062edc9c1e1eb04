// A map from strings that versions share: the layer's overrides and
// identities by id, of which one change must not copy the 100,000 others.

package policy

import "hash/maphash"

// idMap is an immutable map from strings to V, split in buckets by the
// key's hash. A version derived from another (see edit) shares the
// buckets it did not change, so that changing k keys among n copies about
// k*n/len(buckets) entries, and a lookup stays one hash and one small map.
// The zero value is an empty map. It is safe for concurrent reads.
type idMap[V any] struct {
	seed    maphash.Seed
	buckets []map[string]V // a power of two of them
	n       int
}

// bucketLoad is the number of entries per bucket that the bucket count
// aims at: small buckets make a change cheap to copy.
const bucketLoad = 8

func (m *idMap[V]) bucket(k string) int {
	return int(maphash.String(m.seed, k) & uint64(len(m.buckets)-1))
}

// get returns the value of k.
func (m *idMap[V]) get(k string) (V, bool) {
	if len(m.buckets) == 0 {
		var zero V
		return zero, false
	}
	v, ok := m.buckets[m.bucket(k)][k]
	return v, ok
}

// len returns the number of entries.
func (m *idMap[V]) len() int { return m.n }

// all calls f for every entry, in no order, until f returns false.
func (m *idMap[V]) all(f func(string, V) bool) {
	for _, b := range m.buckets {
		for k, v := range b {
			if !f(k, v) {
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
	e := &idMapEdit[V]{}
	if len(m.buckets) == 0 || len(m.buckets) > 4*want || 4*len(m.buckets) < want {
		e.m = idMap[V]{seed: maphash.MakeSeed(), buckets: make([]map[string]V, want)}
		e.owned = make([]bool, want)
		m.all(func(k string, v V) bool {
			e.set(k, v)
			return true
		})
		return e
	}
	e.m = idMap[V]{seed: m.seed, buckets: append([]map[string]V(nil), m.buckets...), n: m.n}
	e.owned = make([]bool, len(m.buckets))
	return e
}

// own returns bucket i, copied first when the edit does not own it yet.
func (e *idMapEdit[V]) own(i int) map[string]V {
	b := e.m.buckets[i]
	if !e.owned[i] {
		nb := make(map[string]V, len(b)+1)
		for k, v := range b {
			nb[k] = v
		}
		b, e.m.buckets[i], e.owned[i] = nb, nb, true
	}
	return b
}

// get returns the value of k in the version being built.
func (e *idMapEdit[V]) get(k string) (V, bool) { return e.m.get(k) }

// set sets k to v.
func (e *idMapEdit[V]) set(k string, v V) {
	b := e.own(e.m.bucket(k))
	if _, ok := b[k]; !ok {
		e.m.n++
	}
	b[k] = v
}

// delete removes k.
func (e *idMapEdit[V]) delete(k string) {
	i := e.m.bucket(k)
	if _, ok := e.m.buckets[i][k]; !ok {
		return
	}
	delete(e.own(i), k)
	e.m.n--
}

// done returns the new version; the edit must not be used afterwards.
func (e *idMapEdit[V]) done() idMap[V] { return e.m }
