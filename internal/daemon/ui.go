// The dashboard (package ui) at /ui/, and GET /api/v1/policy, the summary
// of the policy in force that the dashboard shows.

package daemon

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/ui"
)

// policyPath is where the summary of the policy in force is served.
const policyPath = "/api/v1/policy"

// withUI serves the dashboard's files under /ui/ (no token: they hold no
// data; the page sends the token the APIs ask for) and GET
// /api/v1/policy, and everything else from api. It sits outside the check
// token's guard, so that the page loads where checks require a token.
func (d *Daemon) withUI(api http.Handler) http.Handler {
	files := ui.Handler()
	var pol http.Handler = http.HandlerFunc(d.handlePolicy)
	if d.roles != nil {
		// With a control plane, reading the policy is a viewer's right,
		// as reading its rules through the admin API is.
		pol = d.roles.Require(control.RoleViewer, pol)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case p == policyPath:
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method_not_allowed", "error_description": "use GET"})
				return
			}
			pol.ServeHTTP(w, r)
		case strings.HasPrefix(p, ui.Prefix) || p+"/" == ui.Prefix:
			files.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	})
}

// policySummary is the answer of GET /api/v1/policy: what the policy in
// force limits, and what changes it now (the file's assignments, the
// control plane's overrides and throttles). Expired ones are left out.
type policySummary struct {
	Version string `json:"version"`
	// Source is the configuration file ("builtin" without one).
	Source string `json:"source"`
	// LayerRevision is the control plane's revision applied; 0 without.
	LayerRevision int64          `json:"layer_revision"`
	DefaultTier   string         `json:"default_tier,omitempty"`
	Rules         []ruleSummary  `json:"rules"`
	Tiers         []tierSummary  `json:"tiers"`
	Domains       []string       `json:"envoy_domains,omitempty"`
	Overrides     []overrideView `json:"overrides"`
	Throttles     []throttleView `json:"throttles"`
	// ControlPlane reports whether overrides and throttles can be set
	// here (through the admin API).
	ControlPlane bool `json:"control_plane"`
}

type limitView struct {
	// Algorithm and Window (Go's duration syntax, "1m0s") are empty, and
	// Limit and Burst zero, in an override's limit that inherits them.
	Algorithm string `json:"algorithm,omitempty"`
	Limit     int64  `json:"limit,omitempty"`
	Window    string `json:"window,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	DenyAll   bool   `json:"deny_all,omitempty"`
}

type ruleSummary struct {
	ID         string   `json:"id"`
	Name       string   `json:"name,omitempty"`
	Resources  []string `json:"resources,omitempty"`
	Methods    []string `json:"methods,omitempty"`
	Operations []string `json:"operations,omitempty"`
	Clients    []string `json:"clients,omitempty"`
	Dimension  string   `json:"dimension"`
	// Limit is the rule's own limit; ByTier the limit of each tier for a
	// tiered rule.
	Limit  *limitView           `json:"limit,omitempty"`
	ByTier map[string]limitView `json:"by_tier,omitempty"`
	Shadow bool                 `json:"shadow,omitempty"`
	// GlobalLimit is what every region together admits per window (a
	// fixed window), on top of Limit when the rule has one.
	GlobalLimit *limitView `json:"global_limit,omitempty"`
}

type tierSummary struct {
	Name  string     `json:"name"`
	Limit *limitView `json:"limit,omitempty"`
}

// overrideView is a file assignment (source "file") or a control plane
// override (source "control_plane", with its ID).
type overrideView struct {
	Source    string               `json:"source"`
	ID        string               `json:"id,omitempty"`
	Kind      string               `json:"kind"`
	Value     string               `json:"value"`
	Tier      string               `json:"tier,omitempty"`
	Limits    map[string]limitView `json:"limits,omitempty"`
	ExpiresAt *time.Time           `json:"expires_at,omitempty"`
}

type throttleView struct {
	ID        string     `json:"id"`
	Scope     string     `json:"scope"`
	Target    string     `json:"target,omitempty"`
	Percent   float64    `json:"percent"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func viewLimit(l *policy.Limit) *limitView {
	if l == nil {
		return nil
	}
	s := l.Spec
	return &limitView{Algorithm: s.Algorithm.String(), Limit: s.Limit, Window: s.Window.String(), Burst: s.Burst, DenyAll: s.DenyAll}
}

func expiry(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// handlePolicy answers GET /api/v1/policy.
func (d *Daemon) handlePolicy(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	if d.cfg.Now != nil {
		now = d.cfg.Now()
	}
	c := d.config.Load() // one configuration, whole
	writeJSON(w, http.StatusOK, summarize(c.policy, c.file, c.layer, now, d.plane != nil))
}

// summarize builds the summary of p, the policy in force, from base (the
// file's) and layer (the control plane's, nil without one) at now.
func summarize(p, base *policy.Policy, layer *policy.Layer, now time.Time, plane bool) policySummary {
	s := policySummary{Version: p.Version, Source: p.Source, LayerRevision: p.Layer(), DefaultTier: p.DefaultTier,
		Rules: []ruleSummary{}, Tiers: []tierSummary{}, Domains: p.Domains(),
		Overrides: []overrideView{}, Throttles: []throttleView{}, ControlPlane: plane}
	tiers := make([]string, 0, len(p.Tiers))
	for name := range p.Tiers {
		tiers = append(tiers, name)
	}
	slices.Sort(tiers)
	for _, name := range tiers {
		s.Tiers = append(s.Tiers, tierSummary{Name: name, Limit: viewLimit(p.Tiers[name].Limit)})
	}
	for _, r := range p.Rules {
		rs := ruleSummary{ID: r.ID, Name: r.Name, Resources: r.Resources, Methods: r.Methods, Operations: r.Operations,
			Clients: r.Clients, Dimension: r.DimensionName, Limit: viewLimit(r.Base), Shadow: r.Shadow}
		if g := r.Global; g != nil {
			w := time.Duration(g.Window*g.Quantum) * time.Microsecond
			rs.GlobalLimit = &limitView{Algorithm: g.Algorithm.String(), Limit: g.Limit, Window: w.String()}
		}
		if r.Tiered {
			rs.ByTier = map[string]limitView{}
			for _, t := range tiers {
				if l := viewLimit(r.LimitFor(t, nil)); l != nil {
					rs.ByTier[t] = *l
				}
			}
		}
		s.Rules = append(s.Rules, rs)
	}
	for _, a := range base.Assignments(now) {
		o := overrideView{Source: "file", Kind: a.Kind.String(), Value: a.Value, Tier: a.Tier, ExpiresAt: expiry(a.ExpiresAt)}
		if len(a.Limits) > 0 {
			o.Limits = map[string]limitView{}
			for id, l := range a.Limits {
				o.Limits[id] = *viewLimit(l)
			}
		}
		s.Overrides = append(s.Overrides, o)
	}
	if layer == nil {
		return s
	}
	active := func(t time.Time) bool { return t.IsZero() || now.Before(t) }
	for _, lo := range layer.Overrides {
		if !active(lo.ExpiresAt) {
			continue
		}
		o := overrideView{Source: "control_plane", ID: lo.ID, Kind: lo.Kind.String(), Value: lo.Value,
			Limits: map[string]limitView{}, ExpiresAt: expiry(lo.ExpiresAt)}
		for id, l := range lo.Limits {
			// Fields left zero are inherited from the identity's limit.
			v := limitView{Algorithm: l.Algorithm, Limit: l.Limit, Burst: l.Burst}
			if l.Window > 0 {
				v.Window = l.Window.String()
			}
			o.Limits[id] = v
		}
		s.Overrides = append(s.Overrides, o)
	}
	for _, t := range layer.Throttles {
		if t.Scope == "region" && t.Target != layer.Region {
			continue // another region's
		}
		if active(t.ExpiresAt) {
			s.Throttles = append(s.Throttles, throttleView{ID: t.ID, Scope: t.Scope, Target: t.Target, Percent: t.Percent, ExpiresAt: expiry(t.ExpiresAt)})
		}
	}
	return s
}
