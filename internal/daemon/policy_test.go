package daemon_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
)

// summaryPolicy has a tier of each kind, a tiered rule, and two
// assignments of which one expired before the test clock's epoch.
const summaryPolicy = `version: 1
default_tier: free
tiers:
  free:    { limit: 10,  window: 1s }
  premium: { limit: 100, window: 1s, algorithm: token_bucket, burst: 200 }
assignments:
  - client: old
    tier: premium
    expires_at: 2020-01-01T00:00:00Z
  - client: acme
    tier: premium
    limits:
      orders: { limit: 50 }
rules:
  - id: orders
    name: Orders per client
    match: { resource: /api/orders, method: POST }
    limit: 5
    window: 1m
  - id: api
    match: { resource: "/api/*" }
    dimension: user
    tiered: true
    shadow: true
  - { id: partner, match: { resource: /partner }, window: 1m, global_limit: 40 }
`

// policyAnswer is GET /api/v1/policy's answer, as the dashboard reads it.
type policyAnswer struct {
	Version     string `json:"version"`
	DefaultTier string `json:"default_tier"`
	Rules       []struct {
		ID        string         `json:"id"`
		Name      string         `json:"name"`
		Resources []string       `json:"resources"`
		Methods   []string       `json:"methods"`
		Dimension string         `json:"dimension"`
		Limit     map[string]any `json:"limit"`
		ByTier    map[string]any `json:"by_tier"`
		Shadow    bool           `json:"shadow"`
		Global    map[string]any `json:"global_limit"`
	} `json:"rules"`
	Tiers []struct {
		Name  string         `json:"name"`
		Limit map[string]any `json:"limit"`
	} `json:"tiers"`
	Overrides []struct {
		Source, ID, Kind, Value, Tier string
		Limits                        map[string]map[string]any
	} `json:"overrides"`
	Throttles []struct {
		ID, Scope, Target string
		Percent           float64
	} `json:"throttles"`
	ControlPlane bool `json:"control_plane"`
}

func getPolicy(t *testing.T, url, token string) (int, policyAnswer, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/api/v1/policy", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := read(t, resp)
	var p policyAnswer
	if r.status == http.StatusOK {
		if err := json.Unmarshal([]byte(r.raw), &p); err != nil {
			t.Fatalf("%s: %v", r.raw, err)
		}
	}
	return r.status, p, r.raw
}

func TestPolicySummary(t *testing.T) {
	td := start(t, summaryPolicy)
	status, p, raw := getPolicy(t, td.base, "")
	if status != http.StatusOK {
		t.Fatalf("GET /api/v1/policy: %d %s", status, raw)
	}
	if len(p.Rules) != 3 || p.Rules[0].ID != "orders" || p.Rules[1].ID != "api" || p.Rules[2].ID != "partner" {
		t.Fatalf("rules %s, want orders, api, partner", raw)
	}
	orders, api, partner := p.Rules[0], p.Rules[1], p.Rules[2]
	if g := partner.Global; partner.Limit != nil || g["limit"] != float64(40) || g["window"] != "1m0s" || g["algorithm"] != "fixed_window" {
		t.Errorf("rule partner: limit %v, global limit %v; want none, and 40 per 1m0s in fixed windows", partner.Limit, g)
	}
	if orders.Global != nil {
		t.Errorf("rule orders has a global limit: %v", orders.Global)
	}
	if orders.Name != "Orders per client" || strings.Join(orders.Resources, ",") != "/api/orders" ||
		strings.Join(orders.Methods, ",") != "POST" || orders.Dimension != "client" {
		t.Errorf("rule orders = %+v", orders)
	}
	if l := orders.Limit; l["limit"] != float64(5) || l["window"] != "1m0s" || l["algorithm"] != "sliding_window_counter" {
		t.Errorf("rule orders' limit = %v, want 5 per 1m0s, sliding_window_counter", l)
	}
	if api.Limit != nil || len(api.ByTier) != 2 || !api.Shadow || api.Dimension != "user" {
		t.Errorf("rule api = %+v, want tiered (no own limit, two tiers), shadow, by user", api)
	}
	if len(p.Tiers) != 2 || p.Tiers[0].Name != "free" || p.Tiers[1].Name != "premium" || p.Tiers[1].Limit["burst"] != float64(200) {
		t.Errorf("tiers = %+v, want free, then premium with burst 200", p.Tiers)
	}
	if p.DefaultTier != "free" {
		t.Errorf("default tier %q, want free", p.DefaultTier)
	}
	// The expired assignment is left out.
	if len(p.Overrides) != 1 {
		t.Fatalf("overrides = %+v, want acme's only", p.Overrides)
	}
	if o := p.Overrides[0]; o.Source != "file" || o.Kind != "client" || o.Value != "acme" || o.Tier != "premium" || o.Limits["orders"]["limit"] != float64(50) {
		t.Errorf("override = %+v", o)
	}
	if len(p.Throttles) != 0 || p.ControlPlane {
		t.Errorf("throttles %+v, control plane %v; want none, false", p.Throttles, p.ControlPlane)
	}

	r := post(t, td.base+"/api/v1/policy", "{}")
	if r.status != http.StatusMethodNotAllowed || r.str("error") != "method_not_allowed" {
		t.Errorf("POST /api/v1/policy: %d %s", r.status, r.raw)
	}
}

// TestPolicySummaryControlPlane: with a control plane, the summary is a
// viewer's to read, and shows the plane's overrides and throttles (but
// not another region's throttles).
func TestPolicySummaryControlPlane(t *testing.T) {
	const token = "slc_policy_summary_test_token_0123456789"
	td := start(t, summaryPolicy, func(c *daemon.Config) {
		c.DataDir = t.TempDir()
		c.AdminToken = token
		c.Region = "eu"
	})
	if status, _, raw := getPolicy(t, td.base, ""); status != http.StatusUnauthorized {
		t.Errorf("without a token: %d %s, want 401", status, raw)
	}
	for _, body := range []string{
		`{"scope":"client","target":"bob","reduction_percent":40,"duration_seconds":3600,"reason":"test"}`,
		`{"scope":"region","target":"us","reduction_percent":90,"duration_seconds":3600,"reason":"test"}`,
	} {
		if code, b := adminDo(t, "POST", td.base+"/api/v1/emergency/throttle", token, body); code != http.StatusOK {
			t.Fatalf("throttle: %d %s", code, b)
		}
	}
	if code, b := adminDo(t, "POST", td.base+"/api/v1/clients/bob/override", token,
		`{"limits":{"orders":{"limit":7}},"duration_seconds":3600,"reason":"test"}`); code != http.StatusCreated {
		t.Fatalf("override: %d %s", code, b)
	}
	var p policyAnswer
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var status int
		var raw string
		status, p, raw = getPolicy(t, td.base, token)
		if status != http.StatusOK {
			t.Fatalf("with a token: %d %s", status, raw)
		}
		if len(p.Overrides) == 2 && len(p.Throttles) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after the writes: %s, want acme's and bob's overrides, bob's throttle", raw)
		}
	}
	if th := p.Throttles[0]; th.Scope != "client" || th.Target != "bob" || th.Percent != 40 || th.ID == "" {
		t.Errorf("throttle = %+v, want bob's 40%%", th)
	}
	if o := p.Overrides[1]; o.Source != "control_plane" || o.Value != "bob" || o.ID == "" || o.Limits["orders"]["limit"] != float64(7) {
		t.Errorf("override = %+v, want bob's from the control plane", o)
	}
	if !p.ControlPlane {
		t.Error("control_plane = false, want true")
	}
}
