package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// layerFile is the file a layer applies to in these tests.
const layerFile = `
version: 1
default_tier: free
tiers:
  free:    { limit: 10,  window: 1m }
  premium: { limit: 100, window: 1m }
rules:
  - { id: api, match: { resource: "/api/*" }, dimension: client, tiered: true }
  - { id: login, match: { resource: /login }, dimension: ip, limit: 5, window: 1m }
  - { id: orders, match: { resource: /orders }, dimension: user, limit: 60, window: 1m }
assignments:
  - { client: gold, tier: premium }
`

var lt0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func spec(s string) []byte { return []byte(s) }

func TestWithLayerRules(t *testing.T) {
	p := mustParse(t, layerFile)
	l := &Layer{Revision: 42, Rules: []LayerRule{
		{ID: "login", Version: 1, Spec: spec(`{"id":"login","match":{"resource":"/login"},"dimension":"ip","limit":3,"window":"1m"}`)},
		{ID: "acme-orders", Version: 1, Spec: spec(`{"id":"acme-orders","match":{"resource":"/orders","client":["acme"]},"limit":7,"window":"1s"}`)},
	}}
	lp, err := p.WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(lp.Rules), "api login orders acme-orders"; strings.Join(got, " ") != want {
		t.Errorf("rules = %v, want %s", got, want)
	}
	for i, r := range lp.Rules {
		if r.Index != i {
			t.Errorf("rule %s: Index %d, want %d", r.ID, r.Index, i)
		}
	}
	if lp.Rules[1].Base.Spec.Limit != 3 || p.Rules[1].Base.Spec.Limit != 5 {
		t.Errorf("login limit = %d (file's %d), want 3 (5)", lp.Rules[1].Base.Spec.Limit, p.Rules[1].Base.Spec.Limit)
	}
	if want := p.Version + "+42"; lp.Version != want || lp.Layer() != 42 || p.Layer() != 0 {
		t.Errorf("Version %q Layer %d, want %q 42", lp.Version, lp.Layer(), want)
	}
	for _, tc := range []struct {
		client string
		want   string
	}{
		{"acme", "orders acme-orders"},
		{"other", "orders"},
	} {
		got := ids(lp.Match(&Request{ClientID: tc.client, Resource: "/orders"}, nil))
		if strings.Join(got, " ") != tc.want {
			t.Errorf("client %s: Match = %v, want %s", tc.client, got, tc.want)
		}
	}
	if got := ids(p.Match(&Request{ClientID: "acme", Resource: "/orders"}, nil)); strings.Join(got, " ") != "orders" {
		t.Errorf("file's policy changed: Match = %v", got)
	}
}

// Layer rules of equal limits share one compiled limit, and only those:
// the keys stay the rules' own.
func TestWithLayerRulesShareLimits(t *testing.T) {
	p := mustParse(t, layerFile)
	l := &Layer{Revision: 1, Rules: []LayerRule{
		{ID: "a", Version: 1, Spec: spec(`{"id":"a","match":{"resource":"/a"},"limit":7,"window":"1s"}`)},
		{ID: "b", Version: 1, Spec: spec(`{"id":"b","match":{"resource":"/b"},"limit":7,"window":"1s"}`)},
		{ID: "c", Version: 1, Spec: spec(`{"id":"c","match":{"resource":"/c"},"limit":7,"window":"2s"}`)},
		{ID: "d", Version: 1, Spec: spec(`{"id":"d","match":{"resource":"/d"},"limit":7,"window":"1s","failure_mode":"local","expected_instances":2}`)},
		{ID: "e", Version: 1, Spec: spec(`{"id":"e","match":{"resource":"/e"},"tiered":true}`)},
		{ID: "f", Version: 1, Spec: spec(`{"id":"f","match":{"resource":"/f"},"tiered":true}`)},
	}}
	lp, err := p.WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := map[string]*Rule{}
	for _, x := range lp.Rules {
		r[x.ID] = x
	}
	if r["a"].Base != r["b"].Base {
		t.Error("rules a and b of one limit: two compiled limits, want one")
	}
	if r["a"].Base == r["c"].Base || r["a"].Base == r["d"].Base {
		t.Error("rules a, c and d of different limits share one")
	}
	if r["d"].Base.Local[PriorityNormal].Limit != 4 {
		t.Errorf("rule d's local share = %d, want 4", r["d"].Base.Local[PriorityNormal].Limit)
	}
	for _, tier := range []string{"free", "premium"} {
		if le, lf := r["e"].LimitFor(tier, nil), r["f"].LimitFor(tier, nil); le != lf || le == nil {
			t.Errorf("tier %s: rules e and f have limits %p and %p, want one", tier, le, lf)
		}
	}
	if r["a"].keyPrefix == r["b"].keyPrefix {
		t.Errorf("rules a and b count on one key prefix %q", r["a"].keyPrefix)
	}
}

func TestMatchClientInFile(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - { id: a, match: { client: [acme, beta] }, limit: 1, window: 1s }
  - { id: b, limit: 1, window: 1s }
`)
	for _, tc := range []struct{ client, want string }{
		{"acme", "a b"}, {"beta", "a b"}, {"Acme", "b"}, {"", "b"},
	} {
		if got := strings.Join(ids(p.Match(&Request{ClientID: tc.client, Resource: "/x"}, nil)), " "); got != tc.want {
			t.Errorf("client %q: %s, want %s", tc.client, got, tc.want)
		}
	}
	if _, err := Parse("x.yaml", []byte("version: 1\nrules:\n  - { id: a, match: { client: [\"\"] }, limit: 1, window: 1s }\n")); err == nil {
		t.Error("an empty client id was accepted")
	}
}

func TestWithLayerErrors(t *testing.T) {
	p := mustParse(t, layerFile)
	for _, tc := range []struct {
		name   string
		l      Layer
		object string
		field  string
	}{
		{"bad limit", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","limit":-1,"window":"1s"}`)}}}, "rule", "limit"},
		{"missing window", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","limit":1}`)}}}, "rule", "window"},
		{"missing limit", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","window":"1s"}`)}}}, "rule", "limit"},
		{"global only, no window", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","global_limit":5}`)}}}, "rule", "window"},
		{"global only, burst", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","window":"1s","global_limit":5,"burst":2}`)}}}, "rule", "burst"},
		{"bad glob", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","match":{"resource":"/a/["},"limit":1,"window":"1s"}`)}}}, "rule", "match.resource"},
		{"unknown key", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"x","limt":1,"window":"1s"}`)}}}, "rule", ""},
		{"id mismatch", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`{"id":"y","limit":1,"window":"1s"}`)}}}, "rule", "id"},
		{"not json", Layer{Rules: []LayerRule{{ID: "x", Spec: spec(`[1,2`)}}}, "rule", ""},
		{"unknown tier", Layer{Identities: []LayerIdentity{{Kind: DimClient, Value: "c", Tier: "gold"}}}, "identity", "tier"},
		{"unknown rule", Layer{Overrides: []LayerOverride{{ID: "o", Kind: DimClient, Value: "c", Limits: map[string]LayerLimit{"nope": {Limit: 1}}}}}, "override", "limits.nope"},
		{"bad window", Layer{Overrides: []LayerOverride{{ID: "o", Kind: DimClient, Value: "c", Limits: map[string]LayerLimit{"api": {Window: time.Nanosecond}}}}}, "override", "limits.api.window"},
		{"bad algorithm", Layer{Overrides: []LayerOverride{{ID: "o", Kind: DimClient, Value: "c", Limits: map[string]LayerLimit{"api": {Algorithm: "magic"}}}}}, "override", "limits.api.algorithm"},
		{"bad percent", Layer{Throttles: []LayerThrottle{{ID: "t", Scope: "global", Percent: 120}}}, "throttle", "percent"},
		{"bad scope", Layer{Throttles: []LayerThrottle{{ID: "t", Scope: "planet", Percent: 10}}}, "throttle", "scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lp, err := p.WithLayer(&tc.l, nil)
			if err == nil || lp != nil {
				t.Fatalf("WithLayer = %v, %v; want an error", lp, err)
			}
			var le *LayerError
			if !errors.As(err, &le) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v (%T): want a *LayerError wrapping ErrInvalidConfig", err, err)
			}
			if le.Object != tc.object || le.Field != tc.field {
				t.Errorf("error %v: object %q field %q, want %q %q", err, le.Object, le.Field, tc.object, tc.field)
			}
		})
	}
	if len(p.Rules) != 3 || p.layer != nil {
		t.Error("the file's policy changed")
	}
}

func TestWithLayerIdentitiesAndOverrides(t *testing.T) {
	p := mustParse(t, layerFile)
	l := &Layer{Revision: 1,
		Identities: []LayerIdentity{{Kind: DimClient, Value: "acme", Tier: "premium"}, {Kind: DimClient, Value: "gold", Tier: "free"}},
		Overrides: []LayerOverride{
			{ID: "o-old", Version: 1, Kind: DimClient, Value: "acme", Limits: map[string]LayerLimit{"api": {Limit: 500}}, ExpiresAt: lt0.Add(time.Hour)},
			{ID: "o-new", Version: 2, Kind: DimClient, Value: "acme", Limits: map[string]LayerLimit{"api": {Limit: 700}}, ExpiresAt: lt0.Add(time.Minute)},
			{ID: "o-beta", Version: 1, Kind: DimClient, Value: "beta", Limits: map[string]LayerLimit{"api": {Limit: 20}}},
		}}
	lp, err := p.WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	api := lp.Rules[0]
	for _, tc := range []struct {
		client    string
		at        time.Duration
		wantTier  string
		wantLimit int64
	}{
		{"acme", 0, "premium", 700},               // the newest override
		{"acme", 2 * time.Minute, "premium", 500}, // the newest expired
		{"acme", 2 * time.Hour, "premium", 100},   // both expired: the tier's
		{"gold", 0, "free", 10},                   // the layer's tier over the file's
		{"beta", 0, "free", 20},
		{"other", 0, "free", 10},
	} {
		now := lt0.Add(tc.at)
		tier, a := lp.Lookup(&Request{ClientID: tc.client}, now)
		l := api.LimitAt(tier, a, now)
		if tier != tc.wantTier || l.Spec.Limit != tc.wantLimit {
			t.Errorf("%s at +%v: tier %s limit %d, want %s %d", tc.client, tc.at, tier, l.Spec.Limit, tc.wantTier, tc.wantLimit)
		}
	}
	// The override inherits the window and algorithm, and counts on the
	// rule's keys.
	tier, a := lp.Lookup(&Request{ClientID: "beta"}, lt0)
	ol := api.LimitAt(tier, a, lt0)
	if ol.Spec.Window != time.Minute || ol.Tag != api.LimitFor("free", nil).Tag {
		t.Errorf("override: window %v tag %q, want 1m and the tier's tag %q", ol.Spec.Window, ol.Tag, api.LimitFor("free", nil).Tag)
	}
}

func TestOverrideSharesTheRulesQuantum(t *testing.T) {
	// A daily limit above 26,062 counts at 10 µs; an override of 100 on
	// its own would count at 1 µs, under another tag.
	p := mustParse(t, `
version: 1
rules:
  - { id: daily, limit: 100000, window: 24h }
`)
	lp, err := p.WithLayer(&Layer{Overrides: []LayerOverride{{ID: "o", Kind: DimUser, Value: "u", Limits: map[string]LayerLimit{"daily": {Limit: 100}}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := lp.Rules[0]
	tier, a := lp.Lookup(&Request{User: "u"}, lt0)
	ol := r.LimitAt(tier, a, lt0)
	if ol.Spec.Limit != 100 || ol.Tag != r.Base.Tag {
		t.Errorf("override: limit %d tag %q, want 100 and the rule's tag %q", ol.Spec.Limit, ol.Tag, r.Base.Tag)
	}
}

func TestWithLayerReusesCompiled(t *testing.T) {
	p := mustParse(t, layerFile)
	l := &Layer{Revision: 1,
		Rules:     []LayerRule{{ID: "x", Version: 1, Spec: spec(`{"id":"x","limit":1,"window":"1s"}`)}},
		Overrides: []LayerOverride{{ID: "o", Version: 1, Kind: DimClient, Value: "c", Limits: map[string]LayerLimit{"api": {Limit: 50}}}}}
	a, err := p.WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Revision = 2
	b, err := p.WithLayer(l, a)
	if err != nil {
		t.Fatal(err)
	}
	if a.Rules[3].Base != b.Rules[3].Base || ov(a, "o") != ov(b, "o") {
		t.Error("unchanged rule or override compiled again")
	}
	l.Rules[0] = LayerRule{ID: "x", Version: 2, Spec: spec(`{"id":"x","limit":2,"window":"1s"}`)}
	l.Identities = []LayerIdentity{{Kind: DimClient, Value: "c", Tier: "premium"}}
	c, err := p.WithLayer(l, b)
	if err != nil {
		t.Fatal(err)
	}
	if c.Rules[3].Base.Spec.Limit != 2 {
		t.Errorf("changed rule: limit %d, want 2", c.Rules[3].Base.Spec.Limit)
	}
	if ov(c, "o") == ov(b, "o") {
		t.Error("override reused though the identity's tier changed")
	}
	if b.Rules[3].Base.Spec.Limit != 1 {
		t.Error("the previous policy changed")
	}
}

// ov returns the compiled override id of lp's layer.
func ov(lp *Policy, id string) *override {
	e := lp.layer.override(id)
	if e == nil {
		return nil
	}
	return e.o
}

func TestThrottles(t *testing.T) {
	p := mustParse(t, layerFile)
	l := &Layer{Revision: 1, Region: "eu", Throttles: []LayerThrottle{
		{ID: "g", Scope: "global", Percent: 10, ExpiresAt: lt0.Add(time.Hour)},
		{ID: "r", Scope: "region", Target: "eu", Percent: 30, ExpiresAt: lt0.Add(time.Minute)},
		{ID: "r2", Scope: "region", Target: "us", Percent: 90},
		{ID: "c", Scope: "client", Target: "noisy", Percent: 100, ExpiresAt: lt0.Add(time.Minute)},
	}}
	lp, err := p.WithLayer(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		client string
		at     time.Duration
		want   float64
	}{
		{"a", 0, 30},
		{"a", 2 * time.Minute, 10},
		{"a", 2 * time.Hour, 0},
		{"noisy", 0, 100},
		{"noisy", 2 * time.Minute, 10},
	} {
		if got := lp.Throttle(tc.client, lt0.Add(tc.at)); got != tc.want {
			t.Errorf("%s at +%v: %v, want %v", tc.client, tc.at, got, tc.want)
		}
	}
	if p.Throttle("a", lt0) != 0 {
		t.Error("the file's policy throttles")
	}
	login := lp.Rules[1].Base
	half := lp.Cut(login, 50)
	if half.Spec.Limit != 2 || half.Tag != login.Tag || lp.Cut(login, 50) != half {
		t.Errorf("cut 50%%: limit %d tag %q (want 2, %q), or compiled twice", half.Spec.Limit, half.Tag, login.Tag)
	}
	all := lp.Cut(login, 100)
	if !all.Params[0].DenyAll || all.Tag != login.Tag {
		t.Errorf("cut 100%%: %+v, want deny-all on the same tag", all.Params[0])
	}
	if lp.Cut(login, 0) != login {
		t.Error("cut 0% is not the limit itself")
	}
}

func TestEffectiveLimits(t *testing.T) {
	p := mustParse(t, layerFile)
	lp, err := p.WithLayer(&Layer{Revision: 1,
		Overrides: []LayerOverride{{ID: "o", Version: 1, Kind: DimClient, Value: "gold", Limits: map[string]LayerLimit{"api": {Limit: 400}}, ExpiresAt: lt0.Add(time.Minute)}},
		Throttles: []LayerThrottle{{ID: "t", Scope: "client", Target: "gold", Percent: 50}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pol   *Policy
		at    time.Duration
		value string
		want  EffectiveLimit
	}{
		{lp, 0, "gold", EffectiveLimit{Rule: "api", Tier: "premium", Algorithm: "sliding_window_counter", Limit: 400, Window: "1m0s", Source: "override", OverrideID: "o", ThrottlePercent: 50, EffectiveLimit: 200}},
		{lp, time.Hour, "gold", EffectiveLimit{Rule: "api", Tier: "premium", Algorithm: "sliding_window_counter", Limit: 100, Window: "1m0s", Source: "tier", ThrottlePercent: 50, EffectiveLimit: 50}},
		{p, 0, "other", EffectiveLimit{Rule: "api", Tier: "free", Algorithm: "sliding_window_counter", Limit: 10, Window: "1m0s", Source: "tier", EffectiveLimit: 10}},
	} {
		got := tc.pol.EffectiveLimits(DimClient, tc.value, lt0.Add(tc.at))
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s at +%v: %+v, want [%+v]", tc.value, tc.at, got, tc.want)
		}
	}
}

func FuzzWithLayerRule(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","limit":1,"window":"1s"}`,
		`{"id":"x","match":{"resource":"/a/*","client":["c"]},"tiered":true}`,
		`{"id":"x","tiers":{"free":{"limit":3}},"limit":1,"window":"1m","algorithm":"gcra","burst":2}`,
		`{"id":"api","dimension":"user+endpoint","limit":9,"window":"24h"}`,
		`{"id":"x","window":"1m","global_limit":5}`,
		`{"id":"x","limit":3,"window":"1s","global_limit":7}`,
		`{"id":"x","limit":1e99,"window":"-1s"}`,
		`{"id":"x","limit":9,"window":"1s","reservations":{"queue_limit":3,"quotas":[{"client":"*","weight":2},{"client":"a","resource":"/r","min_guaranteed":4,"max_burst":5}]}}`,
		`[]`, `null`, `{"id":`,
	} {
		f.Add(s)
	}
	p := mustParse(f, layerFile)
	f.Fuzz(func(t *testing.T, s string) {
		lp, err := p.WithLayer(&Layer{Rules: []LayerRule{{ID: "x", Spec: []byte(s)}, {ID: "api", Spec: []byte(s)}}}, nil)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		for _, r := range lp.Rules {
			for _, l := range r.Limits() {
				if l.Spec.Validate() != nil {
					t.Fatalf("rule %s: invalid limit %+v", r.ID, l.Spec)
				}
			}
		}
		lp.Match(&Request{ClientID: "c", Resource: "/a/b"}, nil)
		for _, r := range lp.Rules {
			checkPools(t, r, "/a/b")
		}
	})
}

var _ = sluice.MaxLimit
