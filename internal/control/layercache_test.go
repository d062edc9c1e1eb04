package control

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
)

// The cached build of the layer, after any sequence of changes of the
// store, is the layer built from scratch.
func TestLayerCacheBuildsAsFromScratch(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 2))
		state := map[string]KV{}
		var c layerCache
		rev := int64(0)
		value := func(key string) string {
			switch key[:3] {
			case "rul":
				return fmt.Sprintf(`{"id":%q,"spec":{"id":%q,"limit":%d,"window":"1s"}}`, key[6:], key[6:], 1+rng.IntN(9))
			case "ide":
				return fmt.Sprintf(`{"kind":"client","value":"c%d","tier":"%s"}`, rng.IntN(5), []string{"free", "gold", ""}[rng.IntN(3)])
			case "ove":
				return fmt.Sprintf(`{"id":%q,"kind":"user","value":"u%d","limits":{"a":{"limit":%d,"window":"1m"}},"expires_at":%q}`,
					key[10:], rng.IntN(5), 1+rng.IntN(9), now.Add(time.Duration(rng.IntN(120)-30)*time.Second).Format(time.RFC3339))
			case "thr":
				return fmt.Sprintf(`{"id":%q,"scope":"global","reduction_percent":%d,"expires_at":%q}`,
					key[10:], rng.IntN(100), now.Add(time.Duration(rng.IntN(120)-30)*time.Second).Format(time.RFC3339))
			}
			return `[`
		}
		prefixes := []string{prefixRule, prefixIdentity + "client/", prefixOverride, prefixThrottle}
		for step := range 300 {
			rev++
			for range 1 + rng.IntN(3) {
				key := fmt.Sprintf("%s%d", prefixes[rng.IntN(len(prefixes))], rng.IntN(20))
				kv, ok := state[key]
				switch {
				case ok && rng.IntN(4) == 0:
					delete(state, key)
				case rng.IntN(10) == 0:
					state[key] = KV{Key: key, Value: []byte(`{"expires_at":"nonsense"`), Version: kv.Version + 1, ModRevision: rev}
				default:
					state[key] = KV{Key: key, Value: []byte(value(key)), Version: kv.Version + 1, ModRevision: rev}
				}
			}
			at := now.Add(time.Duration(rng.IntN(60)) * time.Second)
			got, want := c.build(state, rev, "eu", at), buildLayer(state, rev, "eu", at)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d: cached build\n%+v\nwant\n%+v", seed, step, got, want)
			}
			if got, want := c.earliestExpiry(state, at), earliestExpiry(state, at); !got.Equal(want) {
				t.Fatalf("seed %d step %d: earliest expiry %v, want %v", seed, step, got, want)
			}
		}
	}
}

// buildLayer makes the layer of the objects in state at revision rev from
// scratch, as layerCache.build must: leaving out the overrides and
// throttles expired at now, and objects that do not decode.
func buildLayer(state map[string]KV, rev int64, region string, now time.Time) *policy.Layer {
	l := &policy.Layer{Revision: rev, Region: region}
	keys := make([]string, 0, len(state))
	for k := range state {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		o := decodeObject(state[k])
		o.addTo(l, now)
	}
	return l
}

// earliestExpiry is layerCache.earliestExpiry without a cache.
func earliestExpiry(state map[string]KV, now time.Time) time.Time {
	return (&layerCache{}).earliestExpiry(state, now)
}
