package control

import (
	"strings"
	"testing"
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
