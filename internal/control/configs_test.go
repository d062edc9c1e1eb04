package control

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/policy"
)

// A config's global_limit becomes its rule's, which the engine enforces.
func TestConfigRuleCarriesGlobalLimit(t *testing.T) {
	b, err := configRule(Config{ID: "c", ClientID: "acme", Resource: "/a", Algorithm: "fixed_window", BaseRate: 10, GlobalLimit: 25})
	if err != nil || !strings.Contains(string(b), `"global_limit":25`) {
		t.Errorf("configRule: %s, %v; want global_limit 25", b, err)
	}
	b, _ = configRule(Config{ID: "c", ClientID: "acme", Resource: "/a", Algorithm: "fixed_window", BaseRate: 10})
	if strings.Contains(string(b), "global_limit") {
		t.Errorf("configRule without a global limit: %s", b)
	}
}

// A config with a global_limit and no base_rate becomes a rule whose only
// limit is the global one; the fields of a regional limit are refused
// without a base_rate.
func TestConfigGlobalOnly(t *testing.T) {
	c := Config{ID: "c", ClientID: "acme", Resource: "/a", GlobalLimit: 25}
	if err := checkConfig(c); err != nil {
		t.Fatalf("checkConfig: %v", err)
	}
	b, err := configRule(c)
	if err != nil || !strings.Contains(string(b), `"global_limit":25`) || strings.Contains(string(b), `"limit":`) || strings.Contains(string(b), "algorithm") {
		t.Errorf("configRule: %s, %v; want global_limit 25 and no limit nor algorithm", b, err)
	}
	// The rule compiles, as the control plane's layer.
	base, err := policy.Parse("t.yaml", []byte("version: 1\nrules: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := base.WithLayer(&policy.Layer{Revision: 1, Rules: []policy.LayerRule{{ID: configRulePrefix + "c", Spec: b, Version: 1}}}, nil)
	if err != nil || len(p.Rules) != 1 || !p.Rules[0].GlobalOnly() || p.Rules[0].Global.Limit != 25 {
		t.Errorf("the config's rule in a layer: %v, want a rule with only a global limit of 25", err)
	}
	for _, tc := range []struct {
		c     Config
		field string
	}{
		{Config{ID: "c", ClientID: "acme", Resource: "/a"}, "base_rate"},
		{Config{ID: "c", ClientID: "acme", Resource: "/a", Algorithm: "gcra", BaseRate: -1, GlobalLimit: 5}, "base_rate"},
		{Config{ID: "c", ClientID: "acme", Resource: "/a", Algorithm: "gcra", GlobalLimit: 5}, "algorithm"},
		{Config{ID: "c", ClientID: "acme", Resource: "/a", BurstCapacity: 3, GlobalLimit: 5}, "burst_capacity"},
		{Config{ID: "c", ClientID: "acme", Resource: "/a", BaseRate: 5}, "algorithm"},
	} {
		var fe *FieldError
		if err := checkConfig(tc.c); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: %v, want an error on %s", tc.c, err, tc.field)
		}
	}
}
