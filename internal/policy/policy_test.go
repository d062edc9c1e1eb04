package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/keyspace"
)

func mustParse(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func ids(rules []*Rule) []string {
	out := []string{}
	for _, r := range rules {
		out = append(out, r.ID)
	}
	return out
}

func TestDefault(t *testing.T) {
	p := Default()
	if p.Version != "builtin" || p.DefaultTier != "free" {
		t.Fatalf("Default: version %q default tier %q", p.Version, p.DefaultTier)
	}
	if got, want := len(p.Tiers), 4; got != want {
		t.Errorf("tiers: got %d, want %d", got, want)
	}
	algs := map[sluice.Algorithm]bool{}
	for _, r := range p.Rules {
		for _, l := range r.Limits() {
			algs[l.Spec.Algorithm] = true
		}
	}
	if len(algs) < 3 {
		t.Errorf("built-in policy uses %d algorithms, want at least 3", len(algs))
	}
	got := ids(p.Match(&Request{ClientID: "c", Resource: "/api/v1/demo", Method: "GET"}, nil))
	if want := []string{"demo", "api-per-client"}; !reflect.DeepEqual(got, want) {
		t.Errorf("demo rules: got %v, want %v", got, want)
	}
	demo := p.Rules[0]
	if demo.Base.Spec.Limit != 5 || demo.Base.Spec.Window != time.Minute {
		t.Errorf("demo limit: got %+v, want 5 per minute", demo.Base.Spec)
	}
}

const matchPolicy = `
version: 1
rules:
  - {id: exact, match: {resource: /api/v1/orders}, limit: 1, window: 1s}
  - {id: prefix, match: {resource: "/api/*"}, limit: 1, window: 1s}
  - {id: glob, match: {resource: "/api/*/orders"}, limit: 1, window: 1s}
  - {id: glob-ext, match: {resource: "/files/*.json"}, limit: 1, window: 1s}
  - {id: posts, match: {resource: /api/v1/orders, method: [POST, put]}, limit: 1, window: 1s}
  - {id: writes, match: {operation: write}, limit: 1, window: 1s}
  - {id: everything, limit: 1, window: 1s}
  - {id: multi, match: {resource: [/a, "/a/*", "/*/b"]}, limit: 1, window: 1s}
  - {id: deep-prefix, match: {resource: "/api/v1/orders/*"}, limit: 1, window: 1s}
`

func TestMatch(t *testing.T) {
	p := mustParse(t, matchPolicy)
	tests := []struct {
		name string
		req  Request
		want []string
	}{
		{"exact and prefix and glob", Request{Resource: "/api/v1/orders", Method: "GET"}, []string{"exact", "prefix", "glob", "everything"}},
		{"method matches case-insensitively", Request{Resource: "/api/v1/orders", Method: "post"}, []string{"exact", "prefix", "glob", "posts", "everything"}},
		{"operation", Request{Resource: "/x", Operation: "write"}, []string{"writes", "everything"}},
		{"prefix only", Request{Resource: "/api/v2/users"}, []string{"prefix", "everything"}},
		{"prefix needs a segment after it", Request{Resource: "/api"}, []string{"everything"}},
		{"prefix with trailing slash", Request{Resource: "/api/"}, []string{"prefix", "everything"}},
		{"glob does not cross segments", Request{Resource: "/api/v1/x/orders"}, []string{"prefix", "everything"}},
		{"glob extension", Request{Resource: "/files/a.json"}, []string{"glob-ext", "everything"}},
		{"glob extension miss", Request{Resource: "/files/a.xml"}, []string{"everything"}},
		{"no leading slash", Request{Resource: "api/v1/orders"}, []string{"exact", "prefix", "glob", "everything"}},
		{"one rule, several patterns, reported once", Request{Resource: "/a/b"}, []string{"everything", "multi"}},
		{"deep prefix", Request{Resource: "/api/v1/orders/42"}, []string{"prefix", "everything", "deep-prefix"}},
		{"empty resource", Request{}, []string{"everything"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ids(p.Match(&tt.req, nil))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Match(%+v): got %v, want %v", tt.req, got, tt.want)
			}
		})
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	p := mustParse(t, matchPolicy)
	req := &Request{Resource: "/api/v1/orders/42", Method: "GET"}
	dst := make([]*Rule, 0, 16)
	if n := testing.AllocsPerRun(100, func() { dst = p.Match(req, dst[:0]) }); n != 0 {
		t.Errorf("Match allocates %v times per call, want 0", n)
	}
}

func TestKeys(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - {id: per-client, limit: 1, window: 1m, algorithm: fixed_window}
  - {id: composite, dimension: user+endpoint, limit: 1, window: 1s, algorithm: token_bucket}
  - {id: global, dimension: global, limit: 1, window: 1s, algorithm: gcra}
`)
	req := &Request{ClientID: "acme", User: "u:1{x}", Resource: "/api/v1/orders"}
	tests := []struct {
		rule string
		req  *Request
		want string
		ok   bool
	}{
		{"per-client", req, "rl:per-client:fw.1m0s:{client=acme}", true},
		{"composite", req, "rl:composite:tb.1s:{user=u%3A1%7Bx%7D}:endpoint=/api/v1/orders", true},
		{"global", req, "rl:global:gcra.1s:{global}", true},
		{"composite", &Request{ClientID: "acme", Resource: "/x"}, "", false},
	}
	for _, tt := range tests {
		var r *Rule
		for _, x := range p.Rules {
			if x.ID == tt.rule {
				r = x
			}
		}
		got, ok := r.AppendKey(nil, r.Base, tt.req)
		if ok != tt.ok || (ok && string(got) != tt.want) {
			t.Errorf("%s: AppendKey = %q, %v; want %q, %v", tt.rule, got, ok, tt.want, tt.ok)
		}
	}
}

// TestLimitsOfOneStateShareAQuantum checks that a rule's limits that count
// on one state (its tiers, an identity's override, the priority variants)
// count at one quantum, so they share a key, even when one of them alone
// would be counted at a finer one (1 µs up to 26,062 per day, 10 µs above).
func TestLimitsOfOneStateShareAQuantum(t *testing.T) {
	p := mustParse(t, `
version: 1
tiers:
  free: { limit: 20000, window: 24h, algorithm: fixed_window }
  pro: { limit: 30000, window: 24h, algorithm: fixed_window }
default_tier: free
rules:
  - { id: daily, match: { resource: "/api/*" }, tiered: true }
  - { id: near, match: { resource: "/api/*" }, limit: 25000, window: 24h, algorithm: token_bucket, failure_mode: local, expected_instances: 2 }
assignments:
  - { client: big, tier: pro, limits: { daily: { limit: 5000 } } }
`)
	daily, near := p.Rules[0], p.Rules[1]
	req := &Request{ClientID: "acme", Resource: "/api/x"}
	_, big := p.Lookup(&Request{ClientID: "big", Resource: "/api/x"}, time.Now())
	if big == nil {
		t.Fatal("no assignment for client big")
	}
	keys := map[string]bool{}
	for _, l := range []*Limit{daily.LimitFor("free", nil), daily.LimitFor("pro", nil), daily.LimitFor("pro", big)} {
		if l == nil {
			t.Fatal("a tier without a limit")
		}
		k, _ := daily.AppendKey(nil, l, req)
		keys[string(k)] = true
	}
	if len(keys) != 1 {
		t.Errorf("the limits of one rule count on %d keys, want one: %v", len(keys), keys)
	}
	// 25,000 per day at normal priority, 30,000 at high: one quantum.
	if q := [3]int64{near.Base.Params[0].Quantum, near.Base.Params[1].Quantum, near.Base.Params[2].Quantum}; q != [3]int64{10, 10, 10} {
		t.Errorf("priority variants of 25,000 per day: quanta %v, want [10 10 10]", q)
	}
	if q := [3]int64{near.Base.Local[0].Quantum, near.Base.Local[1].Quantum, near.Base.Local[2].Quantum}; q != [3]int64{10, 10, 10} {
		t.Errorf("local shares of 25,000 per day over 2 instances: quanta %v, want [10 10 10]", q)
	}
}

const tierPolicy = `
version: 1
default_tier: free
defaults:
  cost_multipliers: {read: 1, write: 5, delete: 10, export: 100}
  priority_multipliers: {high: 1.5, low: 0.5}
tiers:
  free: {limit: 10, window: 1s}
  premium: {limit: 1000, window: 1s, algorithm: token_bucket, burst: 2000}
rules:
  - id: api
    match: {resource: "/api/*"}
    tiered: true
  - id: search
    match: {resource: /api/search}
    limit: 5
    window: 1m
    tiers:
      premium: {limit: 50}
assignments:
  - client: acme
    tier: premium
  - user: vip
    tier: premium
    limits:
      search: {limit: 500}
    expires_at: 2030-01-01T00:00:00Z
  - user: vip
    tier: free
  - api_key: k1
    limits:
      api: {limit: 77, window: 1s}
`

func TestTiersAndOverrides(t *testing.T) {
	p := mustParse(t, tierPolicy)
	var api, search *Rule
	for _, r := range p.Rules {
		switch r.ID {
		case "api":
			api = r
		case "search":
			search = r
		}
	}
	before := time.Date(2029, 12, 31, 23, 59, 59, 0, time.UTC)
	after := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		req        Request
		now        time.Time
		wantTier   string
		wantAPI    int64
		wantSearch int64
	}{
		{"unknown identity gets the default tier", Request{ClientID: "nobody"}, before, "free", 10, 5},
		{"client assignment", Request{ClientID: "acme"}, before, "premium", 1000, 50},
		{"user override before expiry", Request{ClientID: "nobody", User: "vip"}, before, "premium", 1000, 500},
		{"user override after expiry falls to the next assignment", Request{ClientID: "acme", User: "vip"}, after, "free", 10, 5},
		{"api key wins over user and client", Request{ClientID: "acme", User: "vip", APIKey: "k1"}, before, "free", 77, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tier, a := p.Lookup(&tt.req, tt.now)
			if tier != tt.wantTier {
				t.Errorf("tier: got %q, want %q", tier, tt.wantTier)
			}
			if got := api.LimitFor(tier, a).Spec.Limit; got != tt.wantAPI {
				t.Errorf("api limit: got %d, want %d", got, tt.wantAPI)
			}
			if got := search.LimitFor(tier, a).Spec.Limit; got != tt.wantSearch {
				t.Errorf("search limit: got %d, want %d", got, tt.wantSearch)
			}
		})
	}
	// Priority variants and cost multipliers.
	l := search.LimitFor("free", nil)
	if got := [3]int64{l.Params[PriorityNormal].Limit, l.Params[PriorityHigh].Limit, l.Params[PriorityLow].Limit}; got != [3]int64{5, 7, 2} {
		t.Errorf("priority variants: got %v, want [5 7 2]", got)
	}
	for op, want := range map[string]int64{"read": 2, "write": 10, "delete": 20, "export": 200, "other": 2} {
		if got, _ := search.Cost(op, 2); got != want {
			t.Errorf("cost of %s x2: got %d, want %d", op, got, want)
		}
	}
	if _, ok := search.Cost("export", sluice.MaxLimit); ok {
		t.Errorf("cost overflow not reported")
	}
}

func TestDefaultCostAndPriorityMultipliers(t *testing.T) {
	p := mustParse(t, "version: 1\nrules:\n  - {id: r, limit: 10, window: 1s}\n")
	r := p.Rules[0]
	for op, want := range map[string]int64{"read": 1, "write": 5, "delete": 10} {
		if got, _ := r.Cost(op, 1); got != want {
			t.Errorf("default cost of %s: got %d, want %d", op, got, want)
		}
	}
	if got := [3]int64{r.Base.Params[0].Limit, r.Base.Params[1].Limit, r.Base.Params[2].Limit}; got != [3]int64{10, 12, 8} {
		t.Errorf("default priority variants: got %v, want [10 12 8]", got)
	}
	// The variants share one state, which expires at the slowest refill.
	for pr, p := range r.Base.Params {
		if p.ExpiryLimit != 8 {
			t.Errorf("%s-priority variant: ExpiryLimit %d, want 8, the low limit", Priority(pr), p.ExpiryLimit)
		}
	}
	// So do the local shares: 5, 6 and 4 of 10, 12 and 8 on two instances.
	p = mustParse(t, "version: 1\nrules:\n  - {id: r, limit: 10, window: 1s, failure_mode: local, expected_instances: 2}\n")
	for pr, lp := range p.Rules[0].Base.Local {
		if lp.ExpiryLimit != 4 {
			t.Errorf("%s-priority local share: limit %d, ExpiryLimit %d, want 4", Priority(pr), lp.Limit, lp.ExpiryLimit)
		}
	}
	if r.FailureMode != FailLocal || r.Base.Spec.Algorithm != DefaultAlgorithm || r.Base.Local[PriorityNormal].Limit != r.Base.Params[PriorityNormal].Limit {
		t.Errorf("defaults: failure mode %s, algorithm %s", r.FailureMode, r.Base.Spec.Algorithm)
	}
}

func TestAllowDeny(t *testing.T) {
	p := mustParse(t, `
version: 1
allow:
  - client: internal
  - ip: 10.0.0.0/8
deny:
  - api_key: leaked
  - ip: 203.0.113.7
  - client: internal-but-banned
  - user: internal
  - ip: ::ffff:198.51.100.0/120
  - ip: 2001:db8::/64
`)
	tests := []struct {
		req           Request
		allowed, deny bool
	}{
		{Request{ClientID: "internal"}, true, false},
		{Request{ClientID: "x", IP: "10.1.2.3"}, true, false},
		{Request{ClientID: "x", IP: "::ffff:10.1.2.3"}, true, false},
		{Request{ClientID: "x", IP: "11.1.2.3"}, false, false},
		{Request{ClientID: "x", APIKey: "leaked"}, false, true},
		{Request{ClientID: "x", IP: "203.0.113.7"}, false, true},
		{Request{ClientID: "x", IP: "not-an-ip"}, false, false},
		{Request{ClientID: "x", User: "internal"}, false, true},
		// An IPv4-mapped prefix is its IPv4 prefix (198.51.100.0/24).
		{Request{ClientID: "x", IP: "198.51.100.9"}, false, true},
		{Request{ClientID: "x", IP: "::ffff:198.51.100.9"}, false, true},
		{Request{ClientID: "x", IP: "198.51.101.9"}, false, false},
		// An address with a zone is in the prefix of the address.
		{Request{ClientID: "x", IP: "2001:db8::1%eth0"}, false, true},
	}
	for _, tt := range tests {
		if got := p.Allowed(&tt.req); got != tt.allowed {
			t.Errorf("Allowed(%+v): got %v, want %v", tt.req, got, tt.allowed)
		}
		if got := p.Denied(&tt.req); got != tt.deny {
			t.Errorf("Denied(%+v): got %v, want %v", tt.req, got, tt.deny)
		}
	}
}

func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"missing version", "rules: []\n", "test.yaml:1:1: missing `version: 1`"},
		{"bad version", "version: 2\n", "test.yaml:1:10: version: 2 is not supported"},
		{"unknown top key", "version: 1\nfoo: 1\n", `test.yaml:2:1: top level: unknown key "foo"`},
		{"unknown rule key", "version: 1\nrules:\n  - id: a\n    limit: 1\n    window: 1s\n    colour: red\n", `test.yaml:6:5: rules[0]: unknown key "colour"`},
		{"zero limit", "version: 1\nrules:\n  - {id: a, limit: 0, window: 1s}\n", "test.yaml:3:20: rule \"a\".limit: must be between 1"},
		{"negative limit", "version: 1\nrules:\n  - {id: a, limit: -5, window: 1s}\n", "test.yaml:3:20: rule \"a\".limit: must be between 1"},
		{"unknown algorithm", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, algorithm: magic}\n", `test.yaml:3:46: rule "a".algorithm: sluice: unknown algorithm: "magic"`},
		{"duplicate id", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s}\n  - {id: a, limit: 1, window: 1s}\n", `test.yaml:4:10: rules[1].id: duplicate rule id "a" (first at line 3)`},
		{"missing window", "version: 1\nrules:\n  - {id: a, limit: 1}\n", `test.yaml:3:5: rule "a": missing window`},
		{"bad window", "version: 1\nrules:\n  - {id: a, limit: 1, window: soon}\n", `rule "a".window: want a duration`},
		{"no limit", "version: 1\nrules:\n  - {id: a}\n", "missing limit: set limit and window, global_limit and window, or tiered: true"},
		{"tiered with its own limit", "version: 1\ntiers: {free: {limit: 1, window: 1s}}\nrules:\n  - {id: a, tiered: true, limit: 5}\n", "a tiered rule takes its limits from the tiers"},
		{"tiered without tiers", "version: 1\nrules:\n  - {id: a, tiered: true}\n", "tiered: true needs tiers"},
		{"unknown tier", "version: 1\ntiers: {free: {limit: 1, window: 1s}}\nrules:\n  - {id: a, limit: 1, window: 1s, tiers: {gold: {limit: 2}}}\n", `unknown tier "gold"`},
		{"bad dimension", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, dimension: user+planet}\n", `unknown dimension "planet"`},
		{"bad failure mode", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, failure_mode: shrug}\n", `unknown failure mode "shrug"`},
		{"override of unknown rule", "version: 1\nassignments:\n  - {client: c, limits: {nope: {limit: 1}}}\n", `unknown rule id "nope"`},
		{"bad expiry", "version: 1\nassignments:\n  - {client: c, expires_at: tomorrow}\n", "want an RFC 3339 time"},
		{"mapped prefix shorter than /96", "version: 1\ndeny:\n  - ip: ::ffff:0.0.0.0/95\n", `test.yaml:3:9: deny[0].ip: "::ffff:0.0.0.0/95" is an IPv4-mapped prefix shorter than /96`},
		{"bad cidr", "version: 1\nallow:\n  - ip: 10.0.0.0/99\n", "is not an address or CIDR prefix"},
		{"duplicate key", "version: 1\nversion: 1\n", `duplicate key "version"`},
		{"not a mapping", "- a\n- b\n", "test.yaml:1:1: the file must be a mapping"},
		{"empty resource list", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, match: {resource: []}}\n", `test.yaml:3:53: rule "a".match.resource: must not be an empty list`},
		{"empty method list", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, match: {method: []}}\n", `test.yaml:3:51: rule "a".match.method: must not be an empty list`},
		{"empty operation list", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, match: {operation: []}}\n", `test.yaml:3:54: rule "a".match.operation: must not be an empty list`},
		{"bad glob", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, match: {resource: \"/a/[\"}}\n", "bad glob pattern"},
		{"limit too big for priorities", "version: 1\nrules:\n  - {id: a, limit: 1099511627776, window: 8760h}\n", `rule "a"`},
		{"log too large at high priority", "version: 1\nrules:\n  - {id: a, limit: 9000, window: 1s, algorithm: sliding_window_log}\n", "limit 10800 (at high priority) is above 10000"},
		{"cost multipliers of one operation", "version: 1\ndefaults:\n  cost_multipliers: {Write: 2, write: 5}\n", `test.yaml:3:32: defaults.cost_multipliers: "write" and "Write" name one operation (names are case-insensitive)`},
		{"rule cost multipliers of one operation", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, cost_multipliers: {READ: 1, Read: 3}}\n", `rule "a".cost_multipliers: "Read" and "READ" name one operation`},
		{"yaml syntax", "version: 1\nrules: [\n", "test.yaml:2: yaml: did not find expected node content"},
		{"yaml syntax without a line", "\"", "test.yaml: yaml: found unexpected end of stream"},
		{"second document", "version: 1\n---\ndomain: d\n", "test.yaml:3:1: a second YAML document: a file holds one policy (use the envoy: list for Envoy domains)"},
		{"rules after the end of the document", "version: 1\n...\nrules: [{id: a}]\n", "test.yaml:2: yaml: did not find expected <document start>"},
		{"text after a flow mapping", "{version: 1}\nrules: []\n", "test.yaml:1: yaml: did not find expected <document start>"},
		{"a trailing empty document is no second one", "version: 1\n---\n---\nfoo: 1\n", "test.yaml:4:1: a second YAML document"},
		{"envoy bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", `test.yaml:4:24: rate_limit.unit: invalid rate limit unit "fortnight"`},
		{"envoy empty key", "domain: d\ndescriptors:\n  - value: v\n", "test.yaml:3:5: descriptor has an empty key"},
		{"envoy unknown key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n", `unknown key "ratelimit"`},
		{"envoy duplicate", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", `duplicate descriptor composite key "d.k"`},
		{"envoy empty domain", "domain: \"\"\n", "domain: must not be empty"},
		{"envoy unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "unlimited rate limit must not set unit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse: no error, want %q", tt.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestInvalidValueIsReportedOnce checks that a field given with a bad
// value is reported as bad, and not also as missing, nor does it make
// what refers to its tier unknown.
func TestInvalidValueIsReportedOnce(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"rule limit", "version: 1\nrules:\n  - {id: a, limit: 0, window: 1s}\n",
			[]string{`t.yaml:3:20: rule "a".limit: must be between 1`}},
		{"rule window", "version: 1\nrules:\n  - {id: a, limit: 5, window: 1.5us}\n",
			[]string{`t.yaml:3:31: rule "a".window: must be a whole number of microseconds`}},
		{"rule bad limit and no window", "version: 1\nrules:\n  - {id: a, limit: x}\n",
			[]string{`t.yaml:3:20: rule "a".limit: want an integer`, `t.yaml:3:5: rule "a": missing window`}},
		{"tier limit", "version: 1\ndefault_tier: free\ntiers: {free: {limit: 0, window: 1s}}\nrules:\n  - {id: a, tiered: true}\nassignments:\n  - {client: c, tier: free}\n",
			[]string{`t.yaml:3:23: tiers.free.limit: must be between 1`}},
		{"tier without window", "version: 1\ntiers: {free: {limit: 1}}\nrules:\n  - {id: a, tiered: true}\n",
			[]string{`t.yaml:2:15: tiers.free: missing window`}},
		{"per-tier limit", "version: 1\ntiers: {free: {limit: 1, window: 1s}}\nrules:\n  - {id: a, tiered: true, tiers: {free: {window: 0s}}}\n",
			[]string{`t.yaml:4:50: rule "a".tiers.free.window: must be positive`}},
		{"override", "version: 1\nrules:\n  - {id: a, limit: 5, window: 1s}\nassignments:\n  - {client: c, limits: {a: {burst: -1}}}\n",
			[]string{`t.yaml:5:37: assignments[0].limits.a.burst: must be between 1`}},
		{"envoy unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: sec, requests_per_unit: 1}\n",
			[]string{`t.yaml:4:24: rate_limit.unit: invalid rate limit unit "sec"`}},
		{"envoy requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			[]string{`t.yaml:4:51: rate_limit.requests_per_unit: must be between 0`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.src))
			if err == nil {
				t.Fatal("Parse: no error")
			}
			got := strings.Split(err.Error(), "\n")
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors:\n%v\nwant %d", len(got), err, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("error %d: got %q, want it to start with %q", i, got[i], w)
				}
			}
		})
	}
}

func TestLimits(t *testing.T) {
	p := mustParse(t, tierPolicy)
	// api: 2 tiers; search: base + premium; 2 tiers; 2 overrides.
	if got, want := len(p.Limits()), 8; got != want {
		t.Errorf("Limits: got %d, want %d", got, want)
	}
	p = mustParse(t, envoyFiles["messaging"])
	if got, want := len(p.Limits()), 2; got != want {
		t.Errorf("Envoy Limits: got %d, want %d", got, want)
	}
}

func TestAliasBomb(t *testing.T) {
	// Each level is a list of two descriptors nesting the level before:
	// 2^60 descriptors once the aliases are expanded.
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - {key: k0, descriptors: &l0 [{key: a}]}\n")
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&b, "  - {key: k%d, descriptors: &l%d [{key: a, descriptors: *l%d}, {key: b, descriptors: *l%d}]}\n", i, i, i-1, i-1)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Parse("bomb.yaml", []byte(b.String()))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "too large") {
			t.Fatalf("Parse of an alias bomb: got %v, want an error saying it is too large", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Parse of an alias bomb did not return within 20s")
	}
}

// TestAliasedMatchListsAreBudgeted checks that the patterns of an aliased
// match list count towards the work budget: 600 rules aliasing one list of
// 5000 resource patterns stand for 3,000,000 patterns.
func TestAliasedMatchListsAreBudgeted(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nrules:\n  - id: r0\n    limit: 1\n    window: 1s\n    match:\n      resource: &p\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "        - /a/%d\n", i)
	}
	for i := 1; i < 600; i++ {
		fmt.Fprintf(&b, "  - {id: r%d, limit: 1, window: 1s, match: {resource: *p}}\n", i)
	}
	_, err := Parse("aliases.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("Parse of 600 rules aliasing 5000 patterns: got %v, want an error saying it is too large", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte("version: 1\nrules:\n  - {id: a, limit: 0, window: 1s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":3:") {
		t.Errorf("Load: got %v, want an error naming %s:3", err, path)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Load of a missing file: got %v, want ErrInvalidConfig", err)
	}
}

func TestExampleFiles(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) < 2 {
		t.Fatalf("found %d example files, want at least 2", len(files))
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// The configuration of envoyproxy/ratelimit's README, examples 1 to 9, in
// one file per domain.
var envoyFiles = map[string]string{
	"mongo_cps": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"messaging": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"edge_proxy_per_ip": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4": `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`,
	"internal": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example9": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
}

func entries(kv ...string) []DescriptorEntry {
	var out []DescriptorEntry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestEnvoyOverride checks the limits of descriptors' limit overrides:
// compiled once per domain, counted apart from the configured limits, and
// looked up again without allocating.
func TestEnvoyOverride(t *testing.T) {
	p := mustParse(t, envoyFiles["example8"])
	l, err := p.EnvoyOverride("example8", 3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%s %d/%s", l.FullKey, l.RequestsPerUnit, l.Unit); got != "example8.limit_override 3/1m0s" {
		t.Errorf("got %q, want %q", got, "example8.limit_override 3/1m0s")
	}
	if l.Limit.Spec.Algorithm != sluice.FixedWindow || l.Shadow || l.Name != "" {
		t.Errorf("got %+v, want a fixed window, not shadow, without a name", l)
	}
	if again, _ := p.EnvoyOverride("example8", 3, time.Minute); again != l {
		t.Errorf("the same override compiled twice")
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = p.EnvoyOverride("example8", 3, time.Minute) }); n != 0 {
		t.Errorf("EnvoyOverride of a known override: %v allocations, want 0", n)
	}
	configured := p.EnvoyLimit("example8", entries("key1", "zzz"))
	e := entries("key1", "zzz")
	if got, want := string(l.AppendKey(nil, e)), "rl:envoy:example8:override.fw.1m0s.q1000:{key1=zzz}"; got != want {
		t.Errorf("key: got %q, want %q", got, want)
	}
	// Another limit of the same window counts on the same key, however
	// large (Compile's finest quantum for a day changes past 26,062).
	for _, rpu := range []int64{20_000, 30_000, 1 << 31} {
		day, err := p.EnvoyOverride("example8", 5, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		other, err := p.EnvoyOverride("example8", rpu, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := string(day.AppendKey(nil, e)), string(other.AppendKey(nil, e)); a != b {
			t.Errorf("overrides of 5 and %d per day count on %q and %q, want one key", rpu, a, b)
		}
	}
	if string(configured.AppendKey(nil, e)) == string(l.AppendKey(nil, e)) {
		t.Errorf("an override counts on the configured limit's key")
	}
	if l, err := p.EnvoyOverride("unknown-domain", 3, time.Minute); l != nil || err != nil {
		t.Errorf("unknown domain: got %v, %v, want no limit", l, err)
	}
	for _, bad := range []struct {
		rpu    int64
		window time.Duration
	}{{0, time.Minute}, {1 << 32, time.Minute}, {1, 0}, {1, 2 * 365 * 24 * time.Hour}, {1<<32 - 1, 365 * 24 * time.Hour}} {
		if _, err := p.EnvoyOverride("example8", bad.rpu, bad.window); err == nil {
			t.Errorf("%d per %s: no error", bad.rpu, bad.window)
		}
	}
	// Beyond the cache, overrides are still decided.
	for i := int64(1); i <= MaxEnvoyOverrides+1; i++ {
		if l, err := p.EnvoyOverride("example8", i, time.Second); err != nil || l.RequestsPerUnit != i {
			t.Fatalf("override %d per second: got %v, %v", i, l, err)
		}
	}
}

func TestEnvoyLimit(t *testing.T) {
	pols := map[string]*Policy{}
	for dom, src := range envoyFiles {
		pols[dom] = mustParse(t, src)
	}
	tests := []struct {
		domain  string
		entries []DescriptorEntry
		want    string // "full key rpu/unit", "" for no limit
	}{
		{"mongo_cps", entries("database", "users"), "mongo_cps.database_users 500/1s"},
		{"mongo_cps", entries("database", "other"), ""},
		{"mongo_cps", entries("db", "users"), ""},
		{"messaging", entries("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number 5/24h0m0s"},
		{"messaging", entries("to_number", "2061111111"), "messaging.to_number 100/24h0m0s"},
		{"messaging", entries("message_type", "marketing"), ""},
		{"messaging", entries("message_type", "transactional", "to_number", "1"), ""},
		{"edge_proxy_per_ip", entries("remote_address", "50.0.0.1"), "edge_proxy_per_ip.remote_address 10/1s"},
		{"edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), "edge_proxy_per_ip.remote_address_50.0.0.5 0/1s"},
		{"example4", entries("key", "value", "subkey", "subvalue"), ""},
		{"example4", entries("key", "value"), "example4.key_value 300/1s"},
		{"internal", entries("ldap", "x"), "internal.ldap unlimited"},
		{"example6", entries("service", "auth", "user", "user-a"), "example6.service.user_user-a 10/1s shadow"},
		{"example6", entries("service", "auth", "user", "user-b"), "example6.service.user_user-b 20/1s"},
		{"example6", entries("service", "auth", "user", "user-c"), ""},
		{"example7", entries("key_2", "value_2", "user", "bkthomps"), "example7.key_2_value_2.user_bkthomps 10/1s"},
		{"example8", entries("key1", "value1"), "example8.key1_value1 20/1m0s"},
		{"example8", entries("key1", "zzz"), "example8.key1 10/1m0s"},
		{"example9", entries("key1", "value_1"), "example9.key1_value* 20/1m0s"},
		{"example9", entries("key1", "other"), ""},
		{"unknown-domain", entries("key1", "value1"), ""},
	}
	for _, tt := range tests {
		p := pols[tt.domain]
		if p == nil {
			p = pols["example9"]
		}
		l := p.EnvoyLimit(tt.domain, tt.entries)
		got := ""
		if l != nil {
			switch {
			case l.Unlimited:
				got = l.FullKey + " unlimited"
			default:
				got = fmt.Sprintf("%s %d/%s", l.FullKey, l.RequestsPerUnit, l.Unit)
				if l.Shadow {
					got += " shadow"
				}
			}
		}
		if got != tt.want {
			t.Errorf("%s %v: got %q, want %q", tt.domain, tt.entries, got, tt.want)
		}
	}
	l := pols["example7"].EnvoyLimit("example7", entries("key_2", "value_2", "user", "bkthomps"))
	if !reflect.DeepEqual(l.Replaces, []string{"specific_limit"}) {
		t.Errorf("replaces: got %v", l.Replaces)
	}
	// Each value of a key without value has its own counter.
	l = pols["messaging"].EnvoyLimit("messaging", entries("to_number", "1"))
	k1 := string(l.AppendKey(nil, entries("to_number", "1")))
	k2 := string(l.AppendKey(nil, entries("to_number", "2")))
	if k1 == k2 || k1 != "rl:envoy:messaging:fw.24h0m0s:{to_number=1}" {
		t.Errorf("envoy keys: %q, %q", k1, k2)
	}
}

func TestEnvoyInSluiceFormat(t *testing.T) {
	src := "version: 1\nenvoy:\n" + indent(envoyFiles["messaging"], "  - ") + indent(envoyFiles["example9"], "  - ")
	p := mustParse(t, src)
	if l := p.EnvoyLimit("messaging", entries("to_number", "1")); l == nil || l.RequestsPerUnit != 100 {
		t.Errorf("embedded messaging domain: got %+v", l)
	}
	if l := p.EnvoyLimit("example9", entries("key1", "value2")); l == nil || l.RequestsPerUnit != 20 {
		t.Errorf("embedded example9 domain: got %+v", l)
	}
}

// indent turns a YAML document into one list item.
func indent(doc, first string) string {
	var b strings.Builder
	lines := strings.Split(strings.TrimSpace(doc), "\n")
	for i, l := range lines {
		if i == 0 {
			b.WriteString(first)
		} else {
			b.WriteString(strings.Repeat(" ", len(first)))
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

// FuzzParse checks that no file makes the decoder panic (it calls parse,
// which recovers only what yaml.v3 panics with, where Parse would hide a
// panic of the decoder as an error), that every problem is a *ConfigError
// naming the file and, but for an empty file and some YAML syntax errors,
// the line, and that a policy it accepts answers every query without
// panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte(DefaultYAML))
	f.Add([]byte(matchPolicy))
	f.Add([]byte(tierPolicy))
	f.Add([]byte(reservePolicy))
	for _, src := range envoyFiles {
		f.Add([]byte(src))
	}
	examples, _ := filepath.Glob("../../examples/*.yaml")
	for _, name := range examples {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("version: 1\nrules: &a [*a]\n"))
	f.Add([]byte("version: 1\nrules:\n  - {id: g, window: 1m, global_limit: 5, failure_mode: local, expected_instances: 3}\n  - {id: b, limit: 2, window: 1s, global_limit: 9}\nassignments:\n  - {client: c, limits: {b: {limit: 1}}}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, global_requests_per_unit: 5}\n"))
	f.Add([]byte("version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, match: {resource: [\"/a/*\", \"/*/b\", \"[\"]}}\n"))
	f.Add([]byte("version: 1\ntiers: {free: {limit: 0, window: 1s}}\nrules:\n  - {id: a, tiered: true, tiers: {free: {burst: x}}}\nassignments:\n  - {client: c, tier: free, limits: {a: {limit: 2}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := parse("fuzz.yaml", data)
		if err != nil {
			if p != nil {
				t.Fatalf("Parse returned a policy and an error")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !strings.HasPrefix(err.Error(), "fuzz.yaml:") {
				t.Fatalf("error %q does not start with the file's name", err)
			}
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				for _, e := range j.Unwrap() {
					var ce *ConfigError
					if !errors.As(e, &ce) {
						t.Fatalf("problem %v is not a *ConfigError", e)
					}
					// yaml.v3 gives some syntax errors no line.
					if ce.Line == 0 && len(bytes.TrimSpace(data)) > 0 && !strings.HasPrefix(ce.Msg, "the file must be a mapping") && !strings.HasPrefix(ce.Msg, "yaml: ") {
						t.Fatalf("problem %q has no line", e)
					}
				}
			}
			return
		}
		// A valid policy must answer any request without panicking.
		res := string(data[:min(len(data), 40)])
		for _, req := range []*Request{
			{ClientID: "c", User: "u", IP: "10.0.0.1", Resource: res, Method: "GET", Operation: "write"},
			{ClientID: res, APIKey: res, IP: "::ffff:10.0.0.1", Resource: "/api/v1/" + res, Operation: res},
		} {
			p.Allowed(req)
			p.Denied(req)
			tier, a := p.Lookup(req, time.Unix(0, 0))
			for _, r := range p.Match(req, nil) {
				if l := r.LimitFor(tier, a); l != nil {
					r.AppendKey(nil, l, req)
				}
				r.Cost(req.Operation, 3)
				r.Limits()
			}
		}
		p.Limits()
		p.ListEntries()
		for _, r := range p.Rules {
			checkPools(t, r, res)
		}
		for _, d := range p.Domains() {
			if l := p.EnvoyLimit(d, entries("k", "v", "k2", "")); l != nil {
				l.AppendKey(nil, entries("k", "v"))
			}
			p.EnvoyOverride(d, 7, time.Minute)
		}
	})
}

func benchPolicy(b testing.TB, n int) *Policy {
	var sb strings.Builder
	sb.WriteString("version: 1\nrules:\n")
	for i := 0; i < n; i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&sb, "  - {id: r%d, match: {resource: /api/v%d/svc%d/items}, limit: 10, window: 1s}\n", i, i%7, i)
		case 1:
			fmt.Fprintf(&sb, "  - {id: r%d, match: {resource: \"/api/v%d/svc%d/*\"}, limit: 10, window: 1s}\n", i, i%7, i)
		case 2:
			fmt.Fprintf(&sb, "  - {id: r%d, match: {resource: \"/api/v%d/svc%d/*/detail\"}, limit: 10, window: 1s}\n", i, i%7, i)
		case 3:
			fmt.Fprintf(&sb, "  - {id: r%d, match: {resource: /api/v%d/svc%d/items, method: POST}, limit: 10, window: 1s}\n", i, i%7, i)
		}
	}
	p, err := Parse("bench.yaml", []byte(sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// linearMatch is the naive reference for Match: every rule in policy
// order, each of its patterns tested on its own with the semantics of
// docs/config.md. Match must agree with it; BenchmarkMatch measures both.
func linearMatch(p *Policy, r *Request, dst []*Rule) []*Rule {
	res, slash := resourcePath(r.Resource, true)
	for _, rule := range p.Rules {
		ok := len(rule.Resources) == 0
		for _, pat := range rule.Resources {
			if ok = patternMatches(strings.TrimPrefix(pat, "/"), res, slash); ok {
				break
			}
		}
		if ok {
			dst = appendIf(dst, rule, r)
		}
	}
	return dst
}

// patternMatches reports whether pattern pat (without its leading "/")
// matches resource res, as resourcePath returns it.
func patternMatches(pat, res string, slash bool) bool {
	switch {
	case pat == "*" || pat == "**":
		return true
	case strings.HasSuffix(pat, "/*") && !isGlob(pat[:len(pat)-2]):
		base, _ := resourcePath(pat[:len(pat)-2], false)
		return base == "" || strings.HasPrefix(res, base+"/") || slash && res == base
	}
	pat, _ = resourcePath(pat, false)
	if !isGlob(pat) {
		return res == pat
	}
	ok, _ := path.Match(pat, res)
	return ok
}

func TestMatchAgreesWithLinearScan(t *testing.T) {
	segs := []string{"api", "v1", "v2", "orders", "42", "items", "x", "", "*", "v1\\", ".", "..", "%76%31", "v2?q=1"}
	pats := []string{
		"/api/v1/orders", "/api/*", "/api/v1/*", "api/v2/orders/*", "/api/*/orders", "/*/v1/*",
		"/api/v?/items", "/api/v[12]/orders/42", "*", "/", "/api/v1/orders/", "/x", "/x/*/*", "/api/v1\\/x",
		"/*/v1/orders", "/*/*/42", "/*/v?/items", "/*", "*/v2", "/api/*/*", "/*/*/*/*", "/*/v1/*/items", "/**/v1", "/*/",
		"/api/v1[/]x", "/*/v[12]", "/api/v[12]/*", "/x/[a-z]*", "/[ax]*/v?/\\*", "/api/v1\\\\/x",
		"/api//v1/orders", "/api/./v1/*", "/api/v2/../v1/*/", "/%61pi/v1",
	}
	var sb strings.Builder
	sb.WriteString("version: 1\nrules:\n")
	for i, pat := range pats {
		fmt.Fprintf(&sb, "  - {id: r%d, match: {resource: %q}, limit: 1, window: 1s}\n", i, pat)
		fmt.Fprintf(&sb, "  - {id: m%d, match: {resource: [%q, \"/x\"], method: [get, PUT], operation: write}, limit: 1, window: 1s}\n", i, pat)
	}
	sb.WriteString("  - {id: all, limit: 1, window: 1s}\n")
	p := mustParse(t, sb.String())
	// Every resource of up to 4 segments over segs, with and without a
	// leading slash, and a few methods and operations.
	var resources []string
	var walk func(prefix string, depth int)
	walk = func(prefix string, depth int) {
		resources = append(resources, prefix, strings.TrimPrefix(prefix, "/"))
		if depth == 4 {
			return
		}
		for _, s := range segs {
			walk(prefix+"/"+s, depth+1)
		}
	}
	walk("", 0)
	matched := map[string]bool{}
	for _, res := range resources {
		for _, mo := range [][2]string{{"GET", "write"}, {"put", "WRITE"}, {"POST", "write"}, {"GET", ""}} {
			r := &Request{ClientID: "c", Resource: res, Method: mo[0], Operation: mo[1]}
			got, want := p.Match(r, nil), linearMatch(p, r, nil)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Match(%q, %s, %s) = %v, linear scan %v", res, mo[0], mo[1], ruleIDs(got), ruleIDs(want))
			}
			for _, r := range got {
				matched[r.ID] = true
			}
		}
	}
	for _, r := range p.Rules {
		if !matched[r.ID] {
			t.Errorf("rule %s (%v) matched no request: the test does not exercise it", r.ID, r.Resources)
		}
	}
}

func ruleIDs(rules []*Rule) []string {
	ids := make([]string, len(rules))
	for i, r := range rules {
		ids[i] = r.ID
	}
	return ids
}

// BenchmarkMatch finds the rules of one request among thousands, with the
// trie (Match) and with a linear scan over the same rules (the naive
// reference). The "lead=" policies start every pattern with a glob segment,
// such as "/*/svc7/items": the case a trie keyed on literal segments alone
// would have to scan.
func BenchmarkMatch(b *testing.B) {
	type matchFunc func(*Policy, *Request, []*Rule) []*Rule
	trie := func(p *Policy, r *Request, dst []*Rule) []*Rule { return p.Match(r, dst) }
	for _, bc := range []struct {
		name, lead string
		n          int
	}{{"rules=1000", "", 1000}, {"rules=10000", "", 10000}, {"rules=1000,lead=*", "*", 1000}, {"rules=1000,lead=t[a-z]*", "t[a-z]*", 1000}} {
		p := benchPolicy(b, bc.n)
		req := &Request{ClientID: "c", Resource: fmt.Sprintf("/api/v%d/svc%d/items", (bc.n/2+1)%7, bc.n/2+1), Method: "GET"}
		if bc.lead != "" {
			p = benchGlobPolicy(b, bc.n, bc.lead)
			req.Resource = fmt.Sprintf("/tenant/svc%d/items", bc.n/2)
		}
		for _, m := range []struct {
			name  string
			match matchFunc
		}{{"trie", trie}, {"linear", linearMatch}} {
			b.Run(bc.name+"/"+m.name, func(b *testing.B) {
				dst := make([]*Rule, 0, 16)
				if got := m.match(p, req, dst); len(got) != 1 {
					b.Fatalf("matched %d rules, want 1", len(got))
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					dst = m.match(p, req, dst[:0])
				}
			})
		}
	}
}

// benchGlobPolicy returns n rules whose patterns start with the glob
// segment lead, such as "/*/svc7/items".
func benchGlobPolicy(b *testing.B, n int, lead string) *Policy {
	var sb strings.Builder
	sb.WriteString("version: 1\nrules:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&sb, "  - {id: r%d, match: {resource: \"/%s/svc%d/items\"}, limit: 10, window: 1s}\n", i, lead, i)
	}
	p, err := Parse("bench.yaml", []byte(sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// TestMatchResourceSpellings checks that the spellings of one path that a
// web server takes for the same resource (a trailing slash, "//", "." and
// ".." segments, percent-encoded unreserved characters, a query string)
// match the rules of that resource and count on its endpoint keys, so
// that none escapes a limit; and that resources that differ do not.
func TestMatchResourceSpellings(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - {id: login, match: {resource: /api/v1/login}, dimension: ip, limit: 1, window: 1s}
  - {id: items, match: {resource: "/api/*/items"}, dimension: ip, limit: 1, window: 1s}
  - {id: api, match: {resource: "/api/*"}, dimension: user+endpoint, limit: 1, window: 1s}
  - {id: slash-pattern, match: {resource: "/shop//cart/"}, dimension: endpoint, limit: 1, window: 1s}
  - {id: one-under, match: {resource: "/files/*/"}, dimension: endpoint, limit: 1, window: 1s}
`)
	tests := []struct {
		res      string
		want     []string
		endpoint string // the endpoint value of the keys, when a rule counts by it
	}{
		{"/api/v1/login", []string{"login", "api"}, "/api/v1/login"},
		{"api/v1/login", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/login/", []string{"login", "api"}, "/api/v1/login"},
		{"/api//v1/login", []string{"login", "api"}, "/api/v1/login"},
		{"//api/v1//login//", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/./login", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/x/../login", []string{"login", "api"}, "/api/v1/login"},
		{"/../api/v1/login", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/%6C%6F%67%69%6E", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/%6c%6f%67in", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/%2E%2E/v1/login", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/login?x=1", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v1/login/?", []string{"login", "api"}, "/api/v1/login"},
		{"/api/v2/items/", []string{"items", "api"}, "/api/v2/items"},
		{"/api//v2/items?page=2", []string{"items", "api"}, "/api/v2/items"},
		// A prefix pattern matches the resource spelled with a trailing
		// slash, as documented, and with its dot segments.
		{"/api/", []string{"api"}, "/api"},
		{"/api/.", []string{"api"}, "/api"},
		{"/api/x/..", []string{"api"}, "/api"},
		{"/api", nil, ""},
		{"/api/v1/x/../../..", nil, ""},
		// Patterns are read as resources are.
		{"/shop/cart", []string{"slash-pattern"}, "/shop/cart"},
		{"/shop/cart/", []string{"slash-pattern"}, "/shop/cart"},
		{"/files/a", []string{"one-under"}, "/files/a"},
		{"/files/a/", []string{"one-under"}, "/files/a"},
		{"/files/a/b", nil, ""},
		// Not the same resource: case, an encoded "/", other characters.
		{"/API/v1/login", nil, ""},
		{"/api/v1/Login", []string{"api"}, "/api/v1/Login"},
		{"/api%2Fv1%2Flogin", nil, ""},
		{"/api/v1/login%2F", []string{"api"}, "/api/v1/login%2F"},
		{"/api/v1/login%2f", []string{"api"}, "/api/v1/login%2F"},
		{"/api/v1/log%20in", []string{"api"}, "/api/v1/log%20in"},
		{"/api/v1/login.", []string{"api"}, "/api/v1/login."},
	}
	rules := map[string]*Rule{}
	for _, r := range p.Rules {
		rules[r.ID] = r
	}
	for _, tt := range tests {
		q := &Request{ClientID: "c", User: "u", IP: "192.0.2.1", Resource: tt.res}
		got := p.Match(q, nil)
		if ids := ruleIDs(got); !reflect.DeepEqual(ids, append([]string{}, tt.want...)) {
			t.Errorf("Match(%q): got %v, want %v", tt.res, ids, tt.want)
			continue
		}
		for _, r := range got {
			key, ok := r.AppendKey(nil, r.Base, q)
			if !ok {
				t.Errorf("%q: rule %s: AppendKey not ok", tt.res, r.ID)
				continue
			}
			if !slices.Contains(r.Dimension, DimEndpoint) {
				continue
			}
			q2 := &Request{ClientID: "c", User: "u", IP: "192.0.2.1", Resource: tt.endpoint}
			want, _ := r.AppendKey(nil, r.Base, q2)
			if string(key) != string(want) || !strings.Contains(string(key), "endpoint="+strings.ReplaceAll(tt.endpoint, "%", "%25")) {
				t.Errorf("%q: rule %s: key %q, want %q", tt.res, r.ID, key, want)
			}
		}
	}
}

// TestMethodDimensionIgnoresCase checks that a rule counting by method
// counts the spellings of one method, which its match compares
// case-insensitively, on one key.
func TestMethodDimensionIgnoresCase(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - {id: writes, match: {method: POST}, dimension: client+method, limit: 1, window: 1s}
`)
	r := p.Rules[0]
	want := "rl:writes:swc.1s:{client=acme}:method=POST"
	for _, m := range []string{"POST", "post", "PoSt", "poſt"} {
		q := &Request{ClientID: "acme", Method: m}
		if got := ruleIDs(p.Match(q, nil)); !reflect.DeepEqual(got, []string{"writes"}) {
			t.Errorf("Match(method %q): got %v, want [writes]", m, got)
		}
		if got, ok := r.AppendKey(nil, r.Base, q); !ok || string(got) != want {
			t.Errorf("AppendKey(method %q) = %q, %v; want %q", m, got, ok, want)
		}
	}
	q := &Request{ClientID: "acme", Method: "post"}
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf, _ = r.AppendKey(buf[:0], r.Base, q) }); n != 0 {
		t.Errorf("AppendKey allocates %v times per call, want 0", n)
	}
}

// TestIPDimensionCountsAnAddressOnce checks that a rule counting by ip
// counts the spellings of one address (an IPv4-mapped IPv6 address, IPv6
// in upper case or with zeros written out) on one key, as the allow and
// deny lists match them, and keeps what is not an address as it is.
func TestIPDimensionCountsAnAddressOnce(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - {id: per-ip, dimension: ip, limit: 1, window: 1s}
`)
	r := p.Rules[0]
	for _, tt := range []struct{ ip, want string }{
		{"192.0.2.1", "192.0.2.1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"::FFFF:c000:201", "192.0.2.1"},
		{"2001:db8::1", "2001:db8::1"},
		{"2001:DB8:0:0:0:0:0:1", "2001:db8::1"},
		// A zone is dropped, as the lists drop it: "2001:db8::1%x",
		// "%y", ... would otherwise each count on a key of their own.
		{"fe80::1%eth0", "fe80::1"},
		{"FE80::1%eth1", "fe80::1"},
		{"2001:db8::1%x", "2001:db8::1"},
		{"::ffff:192.0.2.1%y", "192.0.2.1"},
		{"unix:/run/x.sock", "unix:/run/x.sock"},
		{"010.0.0.1", "010.0.0.1"},
	} {
		q := &Request{ClientID: "c", IP: tt.ip}
		got, ok := r.AppendKey(nil, r.Base, q)
		if want := "rl:per-ip:swc.1s:{ip=" + string(keyspace.AppendEscaped(nil, tt.want)) + "}"; !ok || string(got) != want {
			t.Errorf("AppendKey(ip %q) = %q, %v; want %q", tt.ip, got, ok, want)
		}
	}
	q := &Request{ClientID: "c", IP: "2001:db8::1"}
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf, _ = r.AppendKey(buf[:0], r.Base, q) }); n != 0 {
		t.Errorf("AppendKey allocates %v times per call, want 0", n)
	}
}

// TestEnvoyKeysDoNotCollide checks that descriptors whose entries differ
// have keys that differ, a '=' in an entry's key included.
func TestEnvoyKeysDoNotCollide(t *testing.T) {
	p := mustParse(t, `
domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: "a=b", rate_limit: {unit: second, requests_per_unit: 1}}
  - key: x
    descriptors:
      - {key: "y", rate_limit: {unit: second, requests_per_unit: 1}}
`)
	descs := [][]DescriptorEntry{
		{{"a", "b=c"}},
		{{"a=b", "c"}},
		{{"a", "b:c"}},
		{{"x", "1:y=2"}, {"y", "3"}},
		{{"x", "1"}, {"y", "2:y=3"}},
	}
	seen := map[string]int{}
	for i, d := range descs {
		l := p.EnvoyLimit("d", d)
		if l == nil {
			t.Fatalf("EnvoyLimit(%v) = nil", d)
		}
		k := string(l.AppendKey(nil, d))
		if j, dup := seen[k]; dup {
			t.Errorf("descriptors %v and %v share key %q", descs[j], d, k)
		}
		seen[k] = i
	}
}

func TestEnvoyKeyWithEqualsDoesNotAllocate(t *testing.T) {
	p := mustParse(t, `
domain: d
descriptors:
  - {key: "a=b=c", rate_limit: {unit: second, requests_per_unit: 1}}
`)
	d := []DescriptorEntry{{"a=b=c", "v=1"}}
	l := p.EnvoyLimit("d", d)
	if l == nil {
		t.Fatalf("EnvoyLimit(%v) = nil", d)
	}
	if got, want := string(l.AppendKey(nil, d)), "{a%3Db%3Dc=v=1}"; !strings.HasSuffix(got, want) {
		t.Errorf("AppendKey(%v) = %q, want it to end in %q", d, got, want)
	}
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf = l.AppendKey(buf[:0], d) }); n != 0 {
		t.Errorf("AppendKey allocates %v times per call, want 0", n)
	}
}

// TestLongKeysAreShortened: a store key longer than MaxKeyBytes is
// shortened to its prefix, its hash tag (or, when the tag is long, a short
// tag of the same Redis Cluster slot) and the SHA-256 of the whole key, so
// that no key held anywhere is longer than its prefix and 131 bytes; keys
// up to MaxKeyBytes are written in full; distinct long keys stay distinct;
// a key's shortened form is the same at every call; and every key of one
// identity, long or short, stays on one slot.
func TestLongKeysAreShortened(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - {id: per-user, dimension: user, limit: 1, window: 1s, algorithm: token_bucket}
  - {id: composite, dimension: user+endpoint, limit: 1, window: 1s, algorithm: token_bucket}
`)
	perUser, composite := p.Rules[0], p.Rules[1]
	const prefix = "rl:composite:tb.1s:"
	key := func(r *Rule, q *Request) string {
		t.Helper()
		k, ok := r.AppendKey([]byte("before"), r.Base, q)
		if !ok || !strings.HasPrefix(string(k), "before") {
			t.Fatalf("AppendKey(%+v) = %q, %v", q, k, ok)
		}
		return string(k[len("before"):])
	}
	// A resource whose key is exactly MaxKeyBytes long is written in
	// full; one byte more and it is shortened.
	pad := MaxKeyBytes - len(prefix+"{user=u1}:endpoint=/")
	full := key(composite, &Request{User: "u1", Resource: "/" + strings.Repeat("r", pad)})
	if len(full) != MaxKeyBytes || full != prefix+"{user=u1}:endpoint=/"+strings.Repeat("r", pad) {
		t.Errorf("key of %d bytes: %q, want it in full", MaxKeyBytes, full)
	}
	longRes := "/" + strings.Repeat(":", 2000) // escaped: 6000 bytes
	long := key(composite, &Request{User: "u1", Resource: longRes})
	whole := prefix + "{user=u1}:endpoint=/" + strings.Repeat("%3A", 2000)
	sum := sha256.Sum256([]byte(whole))
	if want := prefix + "{user=u1}#" + hex.EncodeToString(sum[:]); long != want {
		t.Errorf("long key = %q, want %q", long, want)
	}
	if again := key(composite, &Request{User: "u1", Resource: longRes}); again != long {
		t.Errorf("one long key, two forms: %q and %q", long, again)
	}
	if other := key(composite, &Request{User: "u1", Resource: longRes + "x"}); other == long {
		t.Errorf("two long keys share the form %q", long)
	}
	short := key(perUser, &Request{User: "u1"})
	if keyspace.Slot(long) != keyspace.Slot(short) {
		t.Errorf("keys of user u1 on two slots: %q and %q", long, short)
	}

	// A user id whose escaped form is over 64 bytes: its own key is
	// written in full, its long keys carry the short tag of its slot.
	user := strings.Repeat("{", 200) // escaped: 600 bytes
	short = key(perUser, &Request{User: user})
	long = key(composite, &Request{User: user, Resource: longRes})
	if len(short) > MaxKeyBytes || !strings.Contains(short, strings.Repeat("%7B", 200)) {
		t.Errorf("key of a long user id = %q, want it in full", short)
	}
	if len(long) > len(prefix)+131 || keyspace.Slot(long) != keyspace.Slot(short) {
		t.Errorf("long key %q (%d bytes, slot %d) of a long user id: want at most %d bytes on the slot %d of %q",
			long, len(long), keyspace.Slot(long), len(prefix)+131, keyspace.Slot(short), short)
	}

	// An Envoy descriptor of 32 entries of 512-byte keys and values.
	e := mustParse(t, `
domain: d
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}
`)
	var entries []DescriptorEntry
	var tag []string // the descriptor's hash tag, written in full
	for i := range 32 {
		k := strings.Repeat(string(rune('a'+i%26)), 512)
		if i == 0 {
			k = "k"
		}
		entries = append(entries, DescriptorEntry{Key: k, Value: strings.Repeat(":", 512)})
		tag = append(tag, k+"="+strings.Repeat("%3A", 512))
	}
	l := e.EnvoyLimit("d", entries[:1])
	if l == nil {
		t.Fatal("EnvoyLimit = nil")
	}
	k1 := string(l.AppendKey(nil, entries))
	if len(k1) > len("rl:envoy:d:fw.1s:")+131 || !strings.HasPrefix(k1, "rl:envoy:d:fw.1s:{") {
		t.Errorf("long Envoy key %q (%d bytes), want at most %d", k1, len(k1), len("rl:envoy:d:fw.1s:")+131)
	}
	if keyspace.Slot(k1) != keyspace.TagSlot(strings.Join(tag, ":")) {
		t.Errorf("long Envoy key %q left the slot of its descriptor", k1)
	}
	entries[31].Value = strings.Repeat(":", 511) + "x"
	if k2 := string(l.AppendKey(nil, entries)); k2 == k1 {
		t.Errorf("two long Envoy keys share the form %q", k1)
	}

	buf := make([]byte, 0, 8<<10)
	q := &Request{User: "u1", Resource: longRes}
	if n := testing.AllocsPerRun(100, func() { buf, _ = composite.AppendKey(buf[:0], composite.Base, q) }); n != 0 {
		t.Errorf("AppendKey of a long key allocates %v times per call, want 0", n)
	}
}

// FuzzEnvoyKeys: two descriptors have one store key only when they are
// the same descriptor, however long their entries; and no key is longer
// than MaxKeyBytes.
func FuzzEnvoyKeys(f *testing.F) {
	f.Add("k\x00v", "k\x00w")
	f.Add("k\x00a=b", "k=a\x00b")
	f.Add("k\x00"+strings.Repeat(":", 400), "k\x00"+strings.Repeat(":", 399)+"%3A")
	f.Add("k\x00"+strings.Repeat("{", 600)+"\x01x\x00y", "k\x00"+strings.Repeat("{", 600)+"\x01x\x00z")
	p := mustParse(f, `
domain: d
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}
`)
	l := p.EnvoyLimit("d", []DescriptorEntry{{"k", ""}})
	entries := func(spec string) []DescriptorEntry {
		var out []DescriptorEntry
		for _, en := range strings.Split(spec, "\x01") {
			k, v, _ := strings.Cut(en, "\x00")
			out = append(out, DescriptorEntry{Key: k, Value: v})
		}
		return out
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := entries(a), entries(b)
		ka, kb := string(l.AppendKey(nil, ea)), string(l.AppendKey(nil, eb))
		if (ka == kb) != slices.Equal(ea, eb) {
			t.Errorf("descriptors %q and %q: keys %q and %q", ea, eb, ka, kb)
		}
		if len(ka) > MaxKeyBytes {
			t.Errorf("key of %d bytes, want at most %d", len(ka), MaxKeyBytes)
		}
		if again := string(l.AppendKey(nil, ea)); again != ka {
			t.Errorf("one descriptor, two keys: %q and %q", ka, again)
		}
	})
}
