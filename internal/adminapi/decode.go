package adminapi

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/control"
)

// MaxDuration is the longest override or throttle accepted.
const MaxDuration = 366 * 24 * time.Hour

// decodeRule decodes a rule as the configuration file writes one, with an
// optional version and reason. pathID, when not empty, is the id of the
// URL, which the body's id must match if it has one.
func decodeRule(data []byte, pathID string) (r control.Rule, reason string, err error) {
	var fields map[string]json.RawMessage
	if err := decodeStrict(data, &fields); err != nil {
		return r, "", err
	}
	if fields == nil {
		return r, "", fieldErr("body", "want a JSON object: the rule as in the configuration's rules:")
	}
	if v, ok := fields["version"]; ok {
		if err := json.Unmarshal(v, &r.Version); err != nil || r.Version < 0 {
			return r, "", fieldErr("version", "want a whole number 0 or more")
		}
		delete(fields, "version")
	}
	if v, ok := fields["reason"]; ok {
		if err := json.Unmarshal(v, &reason); err != nil {
			return r, "", fieldErr("reason", "want a string")
		}
		delete(fields, "reason")
	}
	if v, ok := fields["id"]; ok {
		if err := json.Unmarshal(v, &r.ID); err != nil {
			return r, "", fieldErr("id", "want a string")
		}
	}
	switch {
	case pathID != "" && r.ID == "":
		r.ID = pathID
		fields["id"], _ = json.Marshal(pathID)
	case pathID != "" && r.ID != pathID:
		return r, "", fieldErr("id", "%q differs from the URL's %q", r.ID, pathID)
	case strings.TrimSpace(r.ID) == "":
		return r, "", fieldErr("id", "required")
	}
	r.Spec, err = json.Marshal(fields)
	return r, reason, err
}

// ruleOut returns the JSON of r as the configuration file writes a rule,
// with its version.
func ruleOut(r control.Rule) map[string]any {
	out := map[string]any{}
	_ = json.Unmarshal(r.Spec, &out)
	out["id"] = r.ID
	out["version"] = r.Version
	return out
}

// overrideRequest is the body of POST /api/v1/{kind}/{id}/override.
type overrideRequest struct {
	Limits          map[string]control.LimitSpec `json:"limits"`
	ExpiresAt       *time.Time                   `json:"expires_at"`
	DurationSeconds *float64                     `json:"duration_seconds"`
	Reason          string                       `json:"reason"`
}

// decodeOverride decodes an override of the identity kind/value at now.
func decodeOverride(data []byte, kind, value string, now time.Time) (control.Override, error) {
	var req overrideRequest
	if err := decodeStrict(data, &req); err != nil {
		return control.Override{}, err
	}
	if len(req.Limits) == 0 {
		return control.Override{}, fieldErr("limits", "required: the limits by rule id, such as {\"api\": {\"limit\": 500}}")
	}
	for id, l := range req.Limits {
		switch {
		case strings.TrimSpace(id) == "":
			return control.Override{}, fieldErr("limits", "a rule id is empty")
		case l.Limit < 0:
			return control.Override{}, fieldErr("limits."+id+".limit", "want 0 or more")
		case l.Burst < 0:
			return control.Override{}, fieldErr("limits."+id+".burst", "want 0 or more")
		}
		if l.Window != "" {
			if d, err := time.ParseDuration(l.Window); err != nil || d <= 0 {
				return control.Override{}, fieldErr("limits."+id+".window", "want a positive duration such as 1m")
			}
		}
	}
	exp, err := expiry(req.ExpiresAt, req.DurationSeconds, now)
	if err != nil {
		return control.Override{}, err
	}
	if strings.TrimSpace(req.Reason) == "" {
		return control.Override{}, fieldErr("reason", "required: say why, for the audit trail")
	}
	return control.Override{Kind: kind, Value: value, Limits: req.Limits, ExpiresAt: exp, Reason: req.Reason}, nil
}

// expiry returns the end of an override or throttle: at, or now plus secs;
// exactly one is required, and the end must be after now, at most
// MaxDuration later.
func expiry(at *time.Time, secs *float64, now time.Time) (time.Time, error) {
	var t time.Time
	switch {
	case at != nil && secs != nil:
		return t, fieldErr("expires_at", "give expires_at or duration_seconds, not both")
	case at != nil:
		t = *at
		if !t.After(now) {
			return t, fieldErr("expires_at", "%s is not in the future", t.Format(time.RFC3339))
		}
	case secs != nil:
		if math.IsNaN(*secs) || *secs <= 0 || *secs > MaxDuration.Seconds() {
			return t, fieldErr("duration_seconds", "want more than 0 and at most %d", int64(MaxDuration.Seconds()))
		}
		t = now.Add(time.Duration(*secs * float64(time.Second)))
	default:
		return t, fieldErr("duration_seconds", "required (or expires_at, RFC 3339)")
	}
	if t.Sub(now) > MaxDuration {
		return t, fieldErr("expires_at", "more than %s from now", MaxDuration)
	}
	return t.UTC(), nil
}

// throttleRequest is the body of POST /api/v1/emergency/throttle.
type throttleRequest struct {
	Scope            string     `json:"scope"`
	Target           string     `json:"target"`
	ReductionPercent *float64   `json:"reduction_percent"`
	DurationSeconds  *float64   `json:"duration_seconds"`
	ExpiresAt        *time.Time `json:"expires_at"`
	Reason           string     `json:"reason"`
}

// decodeThrottle decodes an emergency throttle at now.
func decodeThrottle(data []byte, now time.Time) (control.Throttle, error) {
	var req throttleRequest
	if err := decodeStrict(data, &req); err != nil {
		return control.Throttle{}, err
	}
	switch req.Scope {
	case control.ScopeGlobal:
		if req.Target != "" {
			return control.Throttle{}, fieldErr("target", "a global throttle has no target")
		}
	case control.ScopeRegion, control.ScopeClient:
		if strings.TrimSpace(req.Target) == "" {
			return control.Throttle{}, fieldErr("target", "required for scope %q", req.Scope)
		}
	default:
		return control.Throttle{}, fieldErr("scope", "want global, region or client")
	}
	if req.ReductionPercent == nil {
		return control.Throttle{}, fieldErr("reduction_percent", "required")
	}
	if p := *req.ReductionPercent; math.IsNaN(p) || p < 0 || p > 100 {
		return control.Throttle{}, fieldErr("reduction_percent", "want 0 to 100")
	}
	exp, err := expiry(req.ExpiresAt, req.DurationSeconds, now)
	if err != nil {
		return control.Throttle{}, err
	}
	if strings.TrimSpace(req.Reason) == "" {
		return control.Throttle{}, fieldErr("reason", "required: say why, for the audit trail")
	}
	return control.Throttle{Scope: req.Scope, Target: req.Target, ReductionPercent: *req.ReductionPercent, ExpiresAt: exp, Reason: req.Reason}, nil
}

// configRequest is the body of POST /api/v1/configs.
type configRequest struct {
	ID              string             `json:"id"`
	ClientID        string             `json:"client_id"`
	Resource        string             `json:"resource"`
	Algorithm       string             `json:"algorithm"`
	BaseRate        int64              `json:"base_rate"`
	BurstCapacity   int64              `json:"burst_capacity"`
	GlobalLimit     int64              `json:"global_limit"`
	CostMultipliers map[string]float64 `json:"cost_multipliers"`
	Priority        int                `json:"priority"`
	AdaptiveConfig  json.RawMessage    `json:"adaptive_config"`
	Version         int64              `json:"version"`
}

// decodeConfig decodes a config; the Plane validates its values.
func decodeConfig(data []byte) (control.Config, error) {
	var req configRequest
	if err := decodeStrict(data, &req); err != nil {
		return control.Config{}, err
	}
	switch {
	case strings.TrimSpace(req.ClientID) == "":
		return control.Config{}, fieldErr("client_id", "required")
	case strings.TrimSpace(req.Resource) == "":
		return control.Config{}, fieldErr("resource", "required")
	case req.BaseRate < 0 || req.BaseRate == 0 && req.GlobalLimit <= 0:
		return control.Config{}, fieldErr("base_rate", "want more than 0 (requests per second), or 0 with a global_limit")
	case req.BurstCapacity < 0:
		return control.Config{}, fieldErr("burst_capacity", "want 0 or more")
	case req.Version < 0:
		return control.Config{}, fieldErr("version", "want 0 or more")
	}
	if len(req.AdaptiveConfig) > 0 && bytes.Equal(bytes.TrimSpace(req.AdaptiveConfig), []byte("null")) {
		req.AdaptiveConfig = nil
	}
	return control.Config{
		ID: req.ID, ClientID: req.ClientID, Resource: req.Resource, Algorithm: req.Algorithm,
		BaseRate: req.BaseRate, BurstCapacity: req.BurstCapacity, GlobalLimit: req.GlobalLimit,
		CostMultipliers: req.CostMultipliers, Priority: req.Priority, AdaptiveConfig: req.AdaptiveConfig,
		Version: req.Version,
	}, nil
}
