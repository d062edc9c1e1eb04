package control

import (
	"testing"
	"time"
)

// FuzzDecodeObject: whatever a key of the store holds, building the layer
// and finding the next expiry neither panic nor apply what does not decode.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []struct{ key, value string }{
		{"rules/a", `{"id":"a","spec":{"id":"a","limit":1},"version":1}`},
		{"identities/user/u", `{"kind":"user","value":"u","tier":"gold"}`},
		{"overrides/o", `{"id":"o","kind":"client","value":"c","limits":{"api":{"limit":5,"window":"1m"}},"expires_at":"2030-01-01T00:00:00Z","reason":"r"}`},
		{"overrides/o", `{"limits":{"api":{"window":"nonsense"}},"expires_at":"2030-01-01T00:00:00Z"}`},
		{"throttles/t", `{"id":"t","scope":"global","reduction_percent":50,"expires_at":"2030-01-01T00:00:00Z"}`},
		{"configs/c", `{"id":"c","client_id":"x","resource":"/","algorithm":"gcra","base_rate":1,"cost_multipliers":{"POST":2}}`},
		{"configs/c", `{"cost_multipliers":{"a":1e400}}`},
		{"rules/x", `[`},
	} {
		f.Add(s.key, []byte(s.value))
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		state := map[string]KV{key: {Key: key, Value: value, Version: 1}}
		l := buildLayer(state, 1, "eu", now)
		if n := len(l.Rules) + len(l.Identities) + len(l.Overrides) + len(l.Throttles); n > 1 {
			t.Fatalf("one key made %d layer objects", n)
		}
		for _, o := range l.Overrides {
			if !o.ExpiresAt.After(now) {
				t.Fatalf("expired override in the layer: %+v", o)
			}
		}
		if e := earliestExpiry(state, now); !e.IsZero() && !e.After(now) {
			t.Fatalf("next expiry %v not after now", e)
		}
	})
}
