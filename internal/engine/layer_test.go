package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
)

const layerFile = `
version: 1
rules:
  - { id: api, match: { resource: "/api/*" }, dimension: client, algorithm: fixed_window, limit: 4, window: 1m }
`

func withLayer(t testing.TB, e *Engine, l *policy.Layer) {
	t.Helper()
	lp, err := e.Policy().WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.ApplyPolicy(lp)
}

func TestClientRuleViaEngine(t *testing.T) {
	e, _ := newEngine(t, layerFile)
	withLayer(t, e, &policy.Layer{Revision: 1, Rules: []policy.LayerRule{{ID: "acme-api", Version: 1,
		Spec: []byte(`{"id":"acme-api","match":{"resource":"/api/*","client":["acme"]},"algorithm":"fixed_window","limit":1,"window":"1m"}`)}}})
	for _, tc := range []struct {
		client  string
		allowed bool
		rules   int
	}{
		{"acme", true, 2},
		{"acme", false, 2}, // acme-api allows one a minute
		{"other", true, 1},
		{"other", true, 1},
	} {
		r := mustCheck(t, e, Check{ClientID: tc.client, Resource: "/api/x", Cost: 1})
		if r.Allowed != tc.allowed || len(r.Rules) != tc.rules {
			t.Errorf("%s: allowed %v with %d rules, want %v with %d", tc.client, r.Allowed, len(r.Rules), tc.allowed, tc.rules)
		}
	}
}

// A throttle cuts the limit on the same counters, and ends by itself.
func TestThrottleViaEngine(t *testing.T) {
	e, _ := newEngine(t, layerFile)
	for range 2 {
		mustCheck(t, e, Check{ClientID: "c", Resource: "/api/x", Cost: 1})
	}
	withLayer(t, e, &policy.Layer{Revision: 2, Throttles: []policy.LayerThrottle{
		{ID: "t", Scope: "client", Target: "c", Percent: 50, ExpiresAt: t0.Add(30 * time.Second)},
		{ID: "all", Scope: "client", Target: "d", Percent: 100},
	}})
	for _, tc := range []struct {
		client   string
		at       time.Duration
		allowed  bool
		throttle float64
		limit    int64
	}{
		{"c", time.Second, false, 50, 2},    // 2 counted of the cut limit 2
		{"c", 31 * time.Second, true, 0, 4}, // the throttle ended: the third of 4
		{"d", time.Second, false, 100, 0},
		{"e", time.Second, true, 0, 4},
	} {
		r := mustCheck(t, e, Check{ClientID: tc.client, Resource: "/api/x", Cost: 1, Now: t0.Add(tc.at)})
		if r.Allowed != tc.allowed || r.ThrottlePercent != tc.throttle || r.Deciding.ThrottlePercent != tc.throttle || r.Deciding.Limit != tc.limit {
			t.Errorf("%s at +%v: allowed %v throttle %v limit %d, want %v %v %d", tc.client, tc.at, r.Allowed, r.ThrottlePercent, r.Deciding.Limit, tc.allowed, tc.throttle, tc.limit)
		}
	}
	st, err := e.Status(context.Background(), &Check{ClientID: "c", Resource: "/api/x", Now: t0.Add(time.Second)})
	if err != nil || len(st) != 1 || st[0].ThrottlePercent != 50 {
		t.Errorf("Status = %+v, %v; want throttle 50", st, err)
	}
}

// BenchmarkCheckLayer compares the in-process check of the file's policy
// with that of the same policy under a layer without throttles.
func BenchmarkCheckLayer(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	ctx := context.Background()
	c := &Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
	for _, name := range []string{"file", "layer-no-throttle"} {
		b.Run(name, func(b *testing.B) {
			e := newBenchEngine(b)
			if name != "file" {
				withLayer(b, e, &policy.Layer{Revision: 1, Throttles: []policy.LayerThrottle{{ID: "x", Scope: "client", Target: "someone-else", Percent: 50}}})
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Check(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheck10kRules compares the in-process check of 10,000 rules
// from the file with the same rules written through the control plane
// (a layer over an empty file), as the two would serve in one run.
func BenchmarkCheck10kRules(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	const n = 10000
	rule := func(i int) string {
		return fmt.Sprintf(`{"id":"r%d","match":{"resource":"/api/r%d/*"},"dimension":"client","algorithm":"sliding_window_counter","limit":1000000000,"window":"1m"}`, i, i)
	}
	var file strings.Builder
	file.WriteString("version: 1\nrules:\n")
	var layer policy.Layer
	for i := range n {
		fmt.Fprintf(&file, "  - %s\n", rule(i))
		layer.Rules = append(layer.Rules, policy.LayerRule{ID: fmt.Sprintf("r%d", i), Spec: []byte(rule(i)), Version: 1})
	}
	ctx := context.Background()
	for _, name := range []string{"file", "control-plane"} {
		b.Run(name, func(b *testing.B) {
			var e *Engine
			if name == "file" {
				e, _ = newEngine(b, file.String())
			} else {
				e, _ = newEngine(b, "version: 1\nrules: []\n")
				withLayer(b, e, &layer)
			}
			e.now = time.Now
			c := &Check{ClientID: "bench", Resource: "/api/r4242/orders", Cost: 1}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Check(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
