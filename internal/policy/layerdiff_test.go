package policy

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// layerRuleSpecs are the specs the random layers pick their rules from.
var layerRuleSpecs = []string{
	`{"id":%q,"match":{"resource":"/api/*"},"dimension":"client","limit":%d,"window":"1m"}`,
	`{"id":%q,"match":{"resource":"/orders"},"dimension":"user","tiered":true,"tiers":{"premium":{"limit":%d}}}`,
	`{"id":%q,"dimension":"api_key","algorithm":"token_bucket","limit":%d,"window":"1s","burst":7}`,
}

// randomChange changes l as the control plane would between two
// revisions: an override or a tier added, changed or removed, a rule
// changed, or many of them at once. It sometimes makes l invalid.
func randomChange(rng *rand.Rand, l *Layer, seq *int) {
	*seq++
	l.Revision++
	kinds := []Dimension{DimClient, DimUser, DimAPIKey}
	ruleIDs := []string{"api", "login", "orders", "x1", "x2"}
	newOverride := func() LayerOverride {
		lims := map[string]LayerLimit{}
		for range 1 + rng.IntN(2) {
			lims[ruleIDs[rng.IntN(len(ruleIDs))]] = LayerLimit{Limit: int64(1 + rng.IntN(40)), Window: []time.Duration{0, time.Minute, 10 * time.Second}[rng.IntN(3)]}
		}
		var exp time.Time
		if rng.IntN(3) == 0 {
			exp = lt0.Add(time.Duration(rng.IntN(120)) * time.Second)
		}
		return LayerOverride{ID: fmt.Sprintf("o%03d", rng.IntN(60)), Version: int64(*seq), Kind: kinds[rng.IntN(3)],
			Value: fmt.Sprintf("v%d", rng.IntN(8)), Limits: lims, ExpiresAt: exp}
	}
	newIdentity := func() LayerIdentity {
		return LayerIdentity{Kind: kinds[rng.IntN(3)], Value: fmt.Sprintf("v%d", rng.IntN(8)), Tier: []string{"free", "premium"}[rng.IntN(2)]}
	}
	switch rng.IntN(12) {
	case 0, 1, 2: // an override added where its id sorts, or replaced
		o := newOverride()
		i, found := slices.BinarySearchFunc(l.Overrides, o.ID, func(x LayerOverride, id string) int { return cmp.Compare(x.ID, id) })
		if found {
			l.Overrides[i] = o
		} else {
			l.Overrides = slices.Insert(l.Overrides, i, o)
		}
	case 3: // an override removed
		if len(l.Overrides) > 0 {
			i := rng.IntN(len(l.Overrides))
			l.Overrides = slices.Delete(l.Overrides, i, i+1)
		}
	case 4: // an override's version bumped, its content unchanged
		if len(l.Overrides) > 0 {
			l.Overrides[rng.IntN(len(l.Overrides))].Version = int64(*seq)
		}
	case 5: // a tier given, changed or taken back
		if len(l.Identities) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(l.Identities))
			l.Identities = slices.Delete(l.Identities, i, i+1)
		} else {
			l.Identities = slices.Insert(l.Identities, rng.IntN(len(l.Identities)+1), newIdentity())
		}
	case 6: // many tiers at once
		l.Identities = nil
		for range 20 + rng.IntN(10) {
			l.Identities = append(l.Identities, newIdentity())
		}
	case 7: // a rule added, changed or removed
		id := ruleIDs[rng.IntN(len(ruleIDs))]
		i := slices.IndexFunc(l.Rules, func(r LayerRule) bool { return r.ID == id })
		switch {
		case i >= 0 && rng.IntN(3) == 0:
			l.Rules = slices.Delete(l.Rules, i, i+1)
		default:
			r := LayerRule{ID: id, Version: int64(*seq), Spec: fmt.Appendf(nil, layerRuleSpecs[rng.IntN(len(layerRuleSpecs))], id, 1+rng.IntN(90))}
			if i >= 0 {
				l.Rules[i] = r
			} else {
				l.Rules = append(l.Rules, r)
			}
		}
	case 8: // the overrides reordered
		rng.Shuffle(len(l.Overrides), func(i, j int) { l.Overrides[i], l.Overrides[j] = l.Overrides[j], l.Overrides[i] })
	case 9: // many overrides replaced at once
		l.Overrides = nil
		for i := range maxOverrideDiff + 10 {
			o := newOverride()
			o.ID = fmt.Sprintf("m%05d", i)
			l.Overrides = append(l.Overrides, o)
		}
	case 10: // an invalid object: a duplicate id or an unknown rule
		if len(l.Overrides) > 0 && rng.IntN(2) == 0 {
			l.Overrides = append(l.Overrides, l.Overrides[rng.IntN(len(l.Overrides))])
		} else {
			o := newOverride()
			o.Limits = map[string]LayerLimit{"nope": {Limit: 1}}
			l.Overrides = append(l.Overrides, o)
		}
	case 11: // a throttle
		l.Throttles = []LayerThrottle{{ID: "t", Scope: "client", Target: fmt.Sprintf("v%d", rng.IntN(8)), Percent: float64(rng.IntN(101))}}
	}
}

// sameEffective reports the first difference between what a and b apply
// to the identities the random layers name, at a few instants.
func sameEffective(t *testing.T, a, b *Policy) bool {
	t.Helper()
	if got, want := ids(a.Rules), ids(b.Rules); !slices.Equal(got, want) {
		t.Errorf("rules %v, want %v", got, want)
		return false
	}
	for _, at := range []time.Duration{0, 30 * time.Second, time.Hour} {
		now := lt0.Add(at)
		for _, kind := range []Dimension{DimClient, DimUser, DimAPIKey} {
			for v := range 9 {
				value := fmt.Sprintf("v%d", v)
				got, want := a.EffectiveLimits(kind, value, now), b.EffectiveLimits(kind, value, now)
				if !slices.Equal(got, want) {
					t.Errorf("%s %s at +%v: %+v, want %+v", kind, value, at, got, want)
					return false
				}
				q := &Request{ClientID: value, User: value, APIKey: value}
				ta, aa := a.Lookup(q, now)
				tb, ab := b.Lookup(q, now)
				for i, r := range a.Rules {
					la, lb := r.LimitAt(ta, aa, now), b.Rules[i].LimitAt(tb, ab, now)
					if (la == nil) != (lb == nil) || la != nil && (la.Params != lb.Params || la.Tag != lb.Tag || la.Local != lb.Local) {
						t.Errorf("rule %s for %s at +%v: %+v, want %+v", r.ID, value, at, la, lb)
						return false
					}
				}
			}
		}
	}
	return true
}

// Applying the control plane's changes one by one, each over the policy
// of the previous, gives what applying the last layer from nothing gives.
func TestWithLayerIncrementalIsWhole(t *testing.T) {
	p := mustParse(t, layerFile+"  - { user: v1, tier: premium }\n")
	steps := 150
	if raceEnabled {
		steps = 40
	}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			l := &Layer{Revision: 1}
			var cur *Policy
			seq := 0
			for step := range steps {
				next := &Layer{Revision: l.Revision, Rules: slices.Clone(l.Rules), Identities: slices.Clone(l.Identities),
					Overrides: slices.Clone(l.Overrides), Throttles: slices.Clone(l.Throttles)}
				randomChange(rng, next, &seq)
				inc, ierr := p.WithLayer(next, cur)
				whole, werr := p.WithLayer(next, nil)
				// The objects at fault are the same; what is said of them
				// may differ (an override both duplicate and invalid).
				if (ierr == nil) != (werr == nil) || !slices.Equal(faulty(ierr), faulty(werr)) {
					t.Fatalf("step %d: incremental error %v, whole %v", step, ierr, werr)
				}
				if werr != nil {
					continue // the policy in force stays, and so does its layer
				}
				if !sameEffective(t, inc, whole) {
					t.Fatalf("step %d: the incremental apply differs from the whole", step)
				}
				if inc.Layer() != next.Revision {
					t.Fatalf("step %d: revision %d, want %d", step, inc.Layer(), next.Revision)
				}
				cur, l = inc, next
			}
		})
	}
}

// faulty returns the objects err is about, as "object id", sorted.
func faulty(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if le, ok := err.(*LayerError); ok {
			out = append(out, le.Object+" "+le.ID)
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	slices.Sort(out)
	return slices.Compact(out)
}

// A layer of thousands of overrides, whose identities are indexed on
// several goroutines, gives each identity the newest of its overrides of
// each rule (the greatest id, their versions being equal), and its tier.
func TestWithLayerManyOverrides(t *testing.T) {
	p := mustParse(t, bigLayerFile)
	l := bigLayer(50, 4000)
	lp, err := p.WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]string]int64{} // by client and rule
	for _, o := range l.Overrides {
		for rule, ll := range o.Limits {
			want[[2]string{o.Value, rule}] = ll.Limit // in the order of ids
		}
	}
	tiers := map[string]string{}
	for _, li := range l.Identities {
		tiers[li.Value] = li.Tier
	}
	rules := map[string]*Rule{}
	for _, r := range lp.Rules {
		rules[r.ID] = r
	}
	for k, limit := range want {
		tier, a := lp.Lookup(&Request{ClientID: k[0], Resource: "/x"}, lt0)
		if wt := cmp.Or(tiers[k[0]], "free"); tier != wt {
			t.Errorf("client %s: tier %q, want %q", k[0], tier, wt)
		}
		if got := rules[k[1]].LimitAt(tier, a, lt0); got == nil || got.Spec.Limit != limit {
			t.Errorf("client %s, rule %s: limit %+v, want %d", k[0], k[1], got, limit)
		}
	}
}
