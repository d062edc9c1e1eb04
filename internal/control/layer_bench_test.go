package control

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkBuildLayer10kRules100kOverrides builds the layer of a store
// holding 10,000 rules, 5,000 identities' tiers and 100,000 overrides, as
// the plane does at every change before the policy applies it.
func BenchmarkBuildLayer10kRules100kOverrides(b *testing.B) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	state := map[string]KV{}
	put := func(key, value string) {
		state[key] = KV{Key: key, Value: []byte(value), Version: 1, ModRevision: 1}
	}
	for i := range 10_000 {
		id := fmt.Sprintf("r%05d", i)
		put(prefixRule+id, fmt.Sprintf(`{"id":%q,"spec":{"id":%q,"match":{"resource":"/api/v1/svc%d/*"},"dimension":"client","limit":10,"window":"1s"},"version":1}`, id, id, i))
	}
	for c := 0; c < 50_000; c += 10 {
		put(identityKey("client", fmt.Sprintf("c%06d", c)), fmt.Sprintf(`{"kind":"client","value":"c%06d","tier":"premium"}`, c))
	}
	for i := range 100_000 {
		id := fmt.Sprintf("o%06d", i)
		put(prefixOverride+id, fmt.Sprintf(`{"id":%q,"kind":"client","value":"c%06d","limits":{"r%05d":{"limit":%d}},"expires_at":"2030-01-01T00:00:00Z"}`,
			id, i%50_000, (i*7919)%10_000, 20+i%997))
	}
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l := buildLayer(state, 1, "eu", now)
			if len(l.Overrides) != 100_000 || len(l.Rules) != 10_000 {
				b.Fatalf("%d rules, %d overrides", len(l.Rules), len(l.Overrides))
			}
		}
	})
	// One override added, as the plane builds the layer after the change.
	b.Run("one-change", func(b *testing.B) {
		var c layerCache
		c.build(state, 1, "eu", now)
		b.ReportAllocs()
		rev := int64(1)
		for b.Loop() {
			rev++
			key := fmt.Sprintf("%so%06d-new", prefixOverride, rev)
			state[key] = KV{Key: key, Value: []byte(`{"id":"new","kind":"client","value":"newcomer","limits":{"r00001":{"limit":7}},"expires_at":"2030-01-01T00:00:00Z"}`), Version: 1, ModRevision: rev}
			l := c.build(state, rev, "eu", now)
			delete(state, key)
			if len(l.Overrides) != 100_001 {
				b.Fatalf("%d overrides", len(l.Overrides))
			}
		}
	})
}
