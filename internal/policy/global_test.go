package policy

import (
	"strings"
	"testing"
	"time"
)

// A rule's global_limit takes the rule's window, with or without the
// rule's own limit; without it the global limit is the rule's only one.
func TestGlobalLimitParse(t *testing.T) {
	p := mustParse(t, `
version: 1
rules:
  - { id: both, limit: 10, window: 1m, global_limit: 30 }
  - { id: only, window: 1h, global_limit: 500, expected_instances: 4 }
  - { id: open, window: 1s, global_limit: 7, failure_mode: fail_open }
  - { id: none, limit: 10, window: 1m }
`)
	for _, tc := range []struct {
		id         string
		base, only bool
		global     int64
		window     time.Duration
		local      int64 // the local share of a global-only rule; 0: none
	}{
		{"both", true, false, 30, time.Minute, 0},
		{"only", false, true, 500, time.Hour, 125},
		{"open", false, true, 7, time.Second, 0},
		{"none", true, false, 0, 0, 0},
	} {
		var r *Rule
		for _, x := range p.Rules {
			if x.ID == tc.id {
				r = x
			}
		}
		if r == nil {
			t.Fatalf("rule %s: missing", tc.id)
		}
		if (r.Base != nil) != tc.base || r.GlobalOnly() != tc.only {
			t.Errorf("%s: base %v, global only %v; want %v, %v", tc.id, r.Base != nil, r.GlobalOnly(), tc.base, tc.only)
		}
		if tc.global == 0 {
			if r.Global != nil {
				t.Errorf("%s: a global limit %+v, want none", tc.id, r.Global)
			}
			continue
		}
		if r.Global == nil || r.Global.Limit != tc.global || r.Global.WindowDuration() != tc.window {
			t.Errorf("%s: global limit %+v, want %d per %s", tc.id, r.Global, tc.global, tc.window)
		}
		if got := r.GlobalLocal; tc.local == 0 && got != nil || tc.local > 0 && (got == nil || got.Limit != tc.local) {
			t.Errorf("%s: local share %+v, want %d", tc.id, got, tc.local)
		}
		if len(r.Limits()) != 0 && tc.only {
			t.Errorf("%s: limits %v, want none but the global one", tc.id, r.Limits())
		}
	}
}

// A rule's limits are refused with an error naming the field: neither
// limit nor global_limit, a global-only rule without a window or with
// what only a regional limit has, tiered and shadow rules with a global
// limit, bad values.
func TestGlobalLimitParseErrors(t *testing.T) {
	const tiers = "tiers: { free: { limit: 5, window: 1m } }\n"
	for _, tc := range []struct {
		rule, want string
	}{
		{"{ id: a, window: 1m }", `rule "a": missing limit: set limit, or global_limit`},
		{"{ id: a, match: { resource: /x } }", `rule "a": missing limit`},
		{"{ id: a, global_limit: 5 }", `rule "a": missing window`},
		{"{ id: a, window: 1m, global_limit: 0 }", `rule "a".global_limit: 0 per 1m0s: must be at least 1`},
		{"{ id: a, window: 1m, global_limit: -3 }", `rule "a".global_limit`},
		{"{ id: a, window: 1m, global_limit: many }", `rule "a".global_limit`},
		{"{ id: a, window: 0s, global_limit: 5 }", `rule "a".window: must be positive`},
		{"{ id: a, window: soon, global_limit: 5 }", `rule "a".window`},
		{"{ id: a, limit: 5, window: 1m, global_limit: 0 }", `rule "a".global_limit`},
		{"{ id: a, window: 1m, global_limit: 5, algorithm: gcra }", `rule "a".algorithm: a rule with only a global_limit`},
		{"{ id: a, window: 1m, global_limit: 5, burst: 9 }", `rule "a".burst: a rule with only a global_limit`},
		{"{ id: a, window: 1m, global_limit: 5, shadow: true }", `rule "a".global_limit: a shadow rule never denies`},
		{"{ id: a, limit: 5, window: 1m, shadow: true, global_limit: 9 }", `rule "a".global_limit: a shadow rule never denies`},
		{"{ id: a, tiered: true, global_limit: 9 }", `rule "a".global_limit: a tiered rule`},
		{"{ id: a, window: 1m, global_limit: 9, tiers: { free: { limit: 2 } } }", `rule "a".tiers: a rule with only a global_limit`},
	} {
		_, err := Parse("t.yaml", []byte("version: 1\n"+tiers+"rules:\n  - "+tc.rule+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one with %q", tc.rule, err, tc.want)
		}
	}
	// An identity's limits cannot change a global-only rule.
	_, err := Parse("t.yaml", []byte(`
version: 1
rules:
  - { id: g, window: 1m, global_limit: 9 }
assignments:
  - { client: acme, limits: { g: { limit: 100 } } }
`))
	if err == nil || !strings.Contains(err.Error(), `.limits.g: rule "g" has only a global_limit`) {
		t.Errorf("an assignment's limit of a global-only rule: %v", err)
	}
}
