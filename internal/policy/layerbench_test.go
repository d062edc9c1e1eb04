package policy

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// bigLayerFile is the file under the control plane's configuration in the
// benchmarks: tiers, and no rules of its own.
const bigLayerFile = `
version: 1
default_tier: free
tiers:
  free:       { limit: 10,    window: 1m }
  premium:    { limit: 1000,  window: 1m }
  enterprise: { limit: 10000, window: 1m, algorithm: token_bucket, burst: 20000 }
rules: []
`

// bigLayer returns a layer of nRules rules, one identity with a tier for
// every tenth of nOverrides/2 clients, and nOverrides overrides (two per
// client, each of a different rule and limit), ordered by id as the
// control plane builds them.
func bigLayer(nRules, nOverrides int) *Layer {
	l := &Layer{Revision: 1}
	for i := range nRules {
		id := fmt.Sprintf("r%05d", i)
		var spec string
		switch i % 4 {
		case 0:
			spec = fmt.Sprintf(`{"id":%q,"match":{"resource":"/api/v%d/svc%d/items"},"dimension":"client","limit":10,"window":"1s"}`, id, i%7, i)
		case 1:
			spec = fmt.Sprintf(`{"id":%q,"match":{"resource":"/api/v%d/svc%d/*"},"dimension":"client","tiered":true}`, id, i%7, i)
		case 2:
			spec = fmt.Sprintf(`{"id":%q,"match":{"resource":"/api/v%d/svc%d/*/detail"},"dimension":"user","limit":100,"window":"1m","algorithm":"gcra","burst":10}`, id, i%7, i)
		case 3:
			spec = fmt.Sprintf(`{"id":%q,"match":{"resource":"/api/v%d/svc%d/items","method":"POST"},"dimension":"client","limit":5,"window":"1s"}`, id, i%7, i)
		}
		l.Rules = append(l.Rules, LayerRule{ID: id, Spec: []byte(spec), Version: 1})
	}
	clients := max(nOverrides/2, 1)
	for c := 0; c < clients; c += 10 {
		tier := "premium"
		if c%20 == 0 {
			tier = "enterprise"
		}
		l.Identities = append(l.Identities, LayerIdentity{Kind: DimClient, Value: fmt.Sprintf("c%06d", c), Tier: tier})
	}
	for i := range nOverrides {
		rule := fmt.Sprintf("r%05d", (i*7919)%nRules)
		l.Overrides = append(l.Overrides, LayerOverride{ID: fmt.Sprintf("o%06d", i), Version: 1, Kind: DimClient,
			Value: fmt.Sprintf("c%06d", i%clients), Limits: map[string]LayerLimit{rule: {Limit: int64(20 + i%997)}}})
	}
	return l
}

// BenchmarkApplyLayer10kRules100kOverrides applies a configuration of
// 10,000 rules, 5,000 identities' tiers and 100,000 overrides from
// nothing (no previous policy). Besides the time, it reports the CPU time
// of an apply on all threads (its goroutines and the garbage collector's)
// as cpu-ns/op, which a busy machine inflates much less.
func BenchmarkApplyLayer10kRules100kOverrides(b *testing.B) {
	p := mustParse(b, bigLayerFile)
	l := bigLayer(10_000, 100_000)
	b.ReportAllocs()
	cpu0, ok := processCPU()
	for b.Loop() {
		if _, err := p.WithLayer(l, nil); err != nil {
			b.Fatal(err)
		}
	}
	if cpu1, _ := processCPU(); ok {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkApplyOneChange applies the configuration of
// BenchmarkApplyLayer10kRules100kOverrides with one override added, given
// the policy of the configuration without it.
func BenchmarkApplyOneChange(b *testing.B) {
	p := mustParse(b, bigLayerFile)
	l := bigLayer(10_000, 100_000)
	prev, err := p.WithLayer(l, nil)
	if err != nil {
		b.Fatal(err)
	}
	next := *l
	next.Revision++
	// Inserted in the middle, where the control plane's order by id puts it.
	at := len(l.Overrides) / 2
	next.Overrides = slices.Insert(slices.Clone(l.Overrides), at, LayerOverride{ID: l.Overrides[at-1].ID + "-new", Version: 2,
		Kind: DimClient, Value: "newcomer", Limits: map[string]LayerLimit{"r00001": {Limit: 7}}})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.WithLayer(&next, prev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookupBigLayer looks up the tier and the limit of one rule for
// identities with overrides in the configuration of
// BenchmarkApplyLayer10kRules100kOverrides: the check path's part of it.
func BenchmarkLookupBigLayer(b *testing.B) {
	p := mustParse(b, bigLayerFile)
	l := bigLayer(10_000, 100_000)
	lp, err := p.WithLayer(l, nil)
	if err != nil {
		b.Fatal(err)
	}
	byID := map[string]*Rule{}
	for _, r := range lp.Rules {
		byID[r.ID] = r
	}
	type probe struct {
		q *Request
		r *Rule
	}
	var probes []probe
	for i := 0; i < len(l.Overrides); i += len(l.Overrides) / 1024 {
		o := &l.Overrides[i]
		for id := range o.Limits {
			probes = append(probes, probe{&Request{ClientID: o.Value, Resource: "/x"}, byID[id]})
		}
	}
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		pr := &probes[i%len(probes)]
		i++
		tier, a := lp.Lookup(pr.q, now)
		if pr.r.LimitAt(tier, a, now) == nil {
			b.Fatal("no limit")
		}
	}
}

// BenchmarkApplyOtherChange applies the configuration of
// BenchmarkApplyLayer10kRules100kOverrides with one rule's limit or one
// identity's tier changed, given the policy of the configuration before.
// A rule changed decodes one rule but checks every override's parent.
func BenchmarkApplyOtherChange(b *testing.B) {
	p := mustParse(b, bigLayerFile)
	l := bigLayer(10_000, 100_000)
	prev, err := p.WithLayer(l, nil)
	if err != nil {
		b.Fatal(err)
	}
	rule := *l
	rule.Rules = slices.Clone(l.Rules)
	rule.Rules[4] = LayerRule{ID: "r00004", Version: 2, Spec: []byte(`{"id":"r00004","match":{"resource":"/api/v4/svc4/items"},"dimension":"client","limit":11,"window":"1s"}`)}
	tier := *l
	tier.Identities = slices.Clone(l.Identities)
	tier.Identities[11].Tier = "enterprise" // c000110, premium before
	for _, c := range []struct {
		name string
		l    *Layer
	}{{"rule", &rule}, {"tier", &tier}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.WithLayer(c.l, prev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
