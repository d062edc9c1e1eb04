// The layer built again at every change of the store: only the keys whose
// value changed are decoded, and only the keys added are sorted, so that a
// change among 100,000 overrides does not decode the others.

package control

import (
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
)

// layerCache keeps the store's objects decoded, by key, and their keys
// sorted, as of the last build. A value is known unchanged by its key's
// ModRevision and Version. The zero value is an empty cache; it is not
// safe for concurrent use (the Plane's mu guards its own).
type layerCache struct {
	objs map[string]*layerObject
	// keys are the keys of objs, sorted, and sorted their objects.
	keys   []string
	sorted []*layerObject
	// lens are the lengths of the lists of the layer built last, which
	// size the next's.
	lens [4]int
}

// known returns the object decoded from kv, if the cache has it.
func (c *layerCache) known(kv KV) *layerObject {
	o := c.objs[kv.Key]
	if o == nil || kv.ModRevision == 0 || o.modRevision != kv.ModRevision || o.version != kv.Version {
		return nil
	}
	return o
}

// build is buildLayer, decoding only what changed since the last build.
func (c *layerCache) build(state map[string]KV, rev int64, region string, now time.Time) *policy.Layer {
	if c.objs == nil {
		c.objs = make(map[string]*layerObject, len(state))
	}
	var added, changed []string
	kept := 0
	for k, kv := range state {
		if c.known(kv) != nil {
			kept++
			continue
		}
		if _, ok := c.objs[k]; ok {
			kept++
			changed = append(changed, k)
		} else {
			added = append(added, k)
		}
		o := decodeObject(kv)
		c.objs[k] = &o
	}
	for _, k := range changed {
		i, _ := slices.BinarySearch(c.keys, k)
		c.sorted[i] = c.objs[k]
	}
	if kept < len(c.keys) {
		// Some keys are gone.
		keys, sorted := make([]string, 0, len(state)), make([]*layerObject, 0, len(state))
		for i, k := range c.keys {
			if _, ok := state[k]; ok {
				keys, sorted = append(keys, k), append(sorted, c.sorted[i])
			} else {
				delete(c.objs, k)
			}
		}
		c.keys, c.sorted = keys, sorted
	}
	if len(added) > 0 {
		slices.Sort(added)
		keys, sorted := make([]string, 0, len(c.keys)+len(added)), make([]*layerObject, 0, len(c.keys)+len(added))
		i := 0
		for _, k := range added {
			for i < len(c.keys) && c.keys[i] < k {
				keys, sorted = append(keys, c.keys[i]), append(sorted, c.sorted[i])
				i++
			}
			keys, sorted = append(keys, k), append(sorted, c.objs[k])
		}
		c.keys, c.sorted = append(keys, c.keys[i:]...), append(sorted, c.sorted[i:]...)
	}
	l := &policy.Layer{Revision: rev, Region: region}
	l.Rules = sized(l.Rules, c.lens[0])
	l.Identities = sized(l.Identities, c.lens[1])
	l.Overrides = sized(l.Overrides, c.lens[2]+len(added))
	l.Throttles = sized(l.Throttles, c.lens[3])
	for _, o := range c.sorted {
		o.addTo(l, now)
	}
	c.lens = [4]int{len(l.Rules), len(l.Identities), len(l.Overrides), len(l.Throttles)}
	l.Rules, l.Identities, l.Overrides, l.Throttles = orNil(l.Rules), orNil(l.Identities), orNil(l.Overrides), orNil(l.Throttles)
	return l
}

// earliestExpiry is the earliest expiry after now of an override or a
// throttle in state, from the cache for the values it knows; zero when
// none.
func (c *layerCache) earliestExpiry(state map[string]KV, now time.Time) time.Time {
	var next time.Time
	for k, kv := range state {
		if !strings.HasPrefix(k, prefixOverride) && !strings.HasPrefix(k, prefixThrottle) {
			continue
		}
		var at time.Time
		if o := c.known(kv); o != nil {
			at = o.expiresAt
		} else {
			at = decodeExpiry(kv.Value)
		}
		if at.After(now) && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// sized returns a list of capacity n (nil for 0).
func sized[T any](_ []T, n int) []T {
	if n == 0 {
		return nil
	}
	return make([]T, 0, n)
}

// orNil returns list, or nil when it is empty, as buildLayer leaves it.
func orNil[T any](list []T) []T {
	if len(list) == 0 {
		return nil
	}
	return list
}
