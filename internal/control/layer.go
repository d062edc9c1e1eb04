package control

import (
	"encoding/json"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
)

// The store's key layout, under the adapter's prefix (docs/operations.md).
const (
	prefixRule      = "rules/"          // rules/<id>: Rule
	prefixIdentity  = "identities/"     // identities/<kind>/<escaped value>: Identity
	prefixOverride  = "overrides/"      // overrides/<id>: Override
	prefixThrottle  = "throttles/"      // throttles/<id>: Throttle
	prefixConfig    = "configs/"        // configs/<id>: Config, the current version
	prefixConfigVer = "configversions/" // configversions/<id>/<version, 20 digits>: Config
	prefixToken     = "tokens/"         // tokens/<name>: Token
	prefixAudit     = "audit/"          // audit/<unix ns, 20 digits>-<random>: AuditEntry
	prefixInstance  = "instances/"      // instances/<name>: Instance, while it runs
)

// layerKey says whether key holds an object of the layer.
func layerKey(key string) bool {
	for _, p := range [...]string{prefixRule, prefixIdentity, prefixOverride, prefixThrottle, prefixConfig} {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// identityKey is the key of the identity kind/value.
func identityKey(kind, value string) string {
	return prefixIdentity + kind + "/" + url.PathEscape(value)
}

// dimensions are the kinds of identities, as the policy knows them.
var dimensions = map[string]policy.Dimension{
	"client": policy.DimClient, "user": policy.DimUser, "api_key": policy.DimAPIKey,
}

// buildLayer makes the layer of the objects in state at revision rev,
// leaving out the overrides and throttles expired at now. Objects that do
// not decode are left out (they were checked when written).
func buildLayer(state map[string]KV, rev int64, region string, now time.Time) *policy.Layer {
	l := &policy.Layer{Revision: rev, Region: region}
	keys := make([]string, 0, len(state))
	for k := range state {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv := state[k]
		switch {
		case strings.HasPrefix(k, prefixRule):
			var r Rule
			if json.Unmarshal(kv.Value, &r) == nil {
				l.Rules = append(l.Rules, policy.LayerRule{ID: r.ID, Spec: r.Spec, Version: kv.Version})
			}
		case strings.HasPrefix(k, prefixConfig):
			var c Config
			if json.Unmarshal(kv.Value, &c) == nil {
				if spec, err := configRule(c); err == nil {
					l.Rules = append(l.Rules, policy.LayerRule{ID: configRulePrefix + c.ID, Spec: spec, Version: kv.Version})
				}
			}
		case strings.HasPrefix(k, prefixIdentity):
			var id Identity
			if json.Unmarshal(kv.Value, &id) == nil && id.Tier != "" {
				l.Identities = append(l.Identities, policy.LayerIdentity{Kind: dimensions[id.Kind], Value: id.Value, Tier: id.Tier})
			}
		case strings.HasPrefix(k, prefixOverride):
			var o Override
			if json.Unmarshal(kv.Value, &o) == nil && o.ExpiresAt.After(now) {
				lo := policy.LayerOverride{ID: o.ID, Kind: dimensions[o.Kind], Value: o.Value, ExpiresAt: o.ExpiresAt, Version: kv.Version, Limits: map[string]policy.LayerLimit{}}
				for rule, s := range o.Limits {
					w, _ := time.ParseDuration(s.Window)
					lo.Limits[rule] = policy.LayerLimit{Algorithm: s.Algorithm, Limit: s.Limit, Window: w, Burst: s.Burst}
				}
				l.Overrides = append(l.Overrides, lo)
			}
		case strings.HasPrefix(k, prefixThrottle):
			var t Throttle
			if json.Unmarshal(kv.Value, &t) == nil && t.ExpiresAt.After(now) {
				l.Throttles = append(l.Throttles, policy.LayerThrottle{ID: t.ID, Scope: t.Scope, Target: t.Target, Percent: t.ReductionPercent, ExpiresAt: t.ExpiresAt})
			}
		}
	}
	return l
}

// earliestExpiry is the earliest expiry after now of an override or a
// throttle in state; zero when none.
func earliestExpiry(state map[string]KV, now time.Time) time.Time {
	var next time.Time
	for k, kv := range state {
		if !strings.HasPrefix(k, prefixOverride) && !strings.HasPrefix(k, prefixThrottle) {
			continue
		}
		var e struct {
			ExpiresAt time.Time `json:"expires_at"`
		}
		if json.Unmarshal(kv.Value, &e) != nil || !e.ExpiresAt.After(now) {
			continue
		}
		if next.IsZero() || e.ExpiresAt.Before(next) {
			next = e.ExpiresAt
		}
	}
	return next
}
