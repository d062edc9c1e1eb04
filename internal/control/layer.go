package control

import (
	"encoding/json"
	"net/url"
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

// layerObject is the layer's object that a key of the store holds,
// decoded; none of them when the value does not decode.
type layerObject struct {
	modRevision, version int64 // of the value decoded

	rule      *policy.LayerRule
	identity  *policy.LayerIdentity
	override  *policy.LayerOverride
	throttle  *policy.LayerThrottle
	expiresAt time.Time // of an override or a throttle, as written
}

// decodeObject decodes the value of kv as the object its key says.
func decodeObject(kv KV) layerObject {
	o := layerObject{modRevision: kv.ModRevision, version: kv.Version}
	k := kv.Key
	switch {
	case strings.HasPrefix(k, prefixRule):
		var r Rule
		if json.Unmarshal(kv.Value, &r) == nil {
			o.rule = &policy.LayerRule{ID: r.ID, Spec: r.Spec, Version: kv.Version}
		}
	case strings.HasPrefix(k, prefixConfig):
		var c Config
		if json.Unmarshal(kv.Value, &c) == nil {
			if spec, err := configRule(c); err == nil {
				o.rule = &policy.LayerRule{ID: configRulePrefix + c.ID, Spec: spec, Version: kv.Version}
			}
		}
	case strings.HasPrefix(k, prefixIdentity):
		var id Identity
		if json.Unmarshal(kv.Value, &id) == nil && id.Tier != "" {
			o.identity = &policy.LayerIdentity{Kind: dimensions[id.Kind], Value: id.Value, Tier: id.Tier}
		}
	case strings.HasPrefix(k, prefixOverride):
		var ov Override
		if json.Unmarshal(kv.Value, &ov) == nil {
			lo := policy.LayerOverride{ID: ov.ID, Kind: dimensions[ov.Kind], Value: ov.Value, ExpiresAt: ov.ExpiresAt, Version: kv.Version, Limits: map[string]policy.LayerLimit{}}
			for rule, s := range ov.Limits {
				w, _ := time.ParseDuration(s.Window)
				lo.Limits[rule] = policy.LayerLimit{Algorithm: s.Algorithm, Limit: s.Limit, Window: w, Burst: s.Burst}
			}
			o.override, o.expiresAt = &lo, ov.ExpiresAt
		} else {
			o.expiresAt = decodeExpiry(kv.Value)
		}
	case strings.HasPrefix(k, prefixThrottle):
		var t Throttle
		if json.Unmarshal(kv.Value, &t) == nil {
			o.throttle = &policy.LayerThrottle{ID: t.ID, Scope: t.Scope, Target: t.Target, Percent: t.ReductionPercent, ExpiresAt: t.ExpiresAt}
			o.expiresAt = t.ExpiresAt
		} else {
			o.expiresAt = decodeExpiry(kv.Value)
		}
	}
	return o
}

// decodeExpiry returns the expires_at of an override's or a throttle's
// value, even when the rest of it does not decode; zero when it has none.
func decodeExpiry(value []byte) time.Time {
	var e struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	json.Unmarshal(value, &e) //nolint:errcheck // zero when it does not decode
	return e.ExpiresAt
}

// addTo appends o to l, unless it is an override or a throttle expired at
// now.
func (o *layerObject) addTo(l *policy.Layer, now time.Time) {
	switch {
	case o.rule != nil:
		l.Rules = append(l.Rules, *o.rule)
	case o.identity != nil:
		l.Identities = append(l.Identities, *o.identity)
	case o.override != nil && o.override.ExpiresAt.After(now):
		l.Overrides = append(l.Overrides, *o.override)
	case o.throttle != nil && o.throttle.ExpiresAt.After(now):
		l.Throttles = append(l.Throttles, *o.throttle)
	}
}
