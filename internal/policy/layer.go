// The control plane's layer over a policy: rules, identities' tiers,
// temporary overrides and emergency throttles written while Sluice runs.

package policy

import "time"

// Layer is what the control plane adds to the policy of the configuration
// file. Its rules are added after the file's, and a layer rule with the id
// of a file rule replaces it; its identities and overrides take precedence
// over the file's assignments; its throttles cut effective limits.
type Layer struct {
	// Revision is the control plane's revision the layer was read at.
	Revision int64
	// Region is this instance's region, for throttles of scope "region".
	Region string
	// Rules are rules in the configuration file's format, one JSON object
	// each, as an item of its `rules:` list.
	Rules []LayerRule
	// Identities give identities a tier.
	Identities []LayerIdentity
	// Overrides give identities their own limits on some rules until they
	// expire.
	Overrides []LayerOverride
	// Throttles cut effective limits until they expire.
	Throttles []LayerThrottle
}

// LayerRule is a rule of the layer.
type LayerRule struct {
	ID string
	// Spec is the rule as a JSON object with the configuration file's
	// field names.
	Spec []byte
	// Version is the rule's version in the control plane. WithLayer
	// compiles a rule again only when its spec changed, whatever its
	// version.
	Version int64
}

// LayerIdentity gives one identity a tier.
type LayerIdentity struct {
	Kind  Dimension // DimClient, DimUser or DimAPIKey
	Value string
	Tier  string
}

// LayerOverride gives one identity its own limits on some rules.
type LayerOverride struct {
	ID    string
	Kind  Dimension // DimClient, DimUser or DimAPIKey
	Value string
	// Limits are by rule id; fields left zero come from the limit the rule
	// would otherwise apply to the identity.
	Limits    map[string]LayerLimit
	ExpiresAt time.Time
	// Version is the override's version in the control plane: WithLayer
	// compiles an override again only when its id, version or identity
	// changed (or its identity's tier, or its rules), and takes one whose
	// limits or expiry changed without a new version for unchanged.
	Version int64
}

// LayerLimit is a limit of an override; zero fields are inherited.
type LayerLimit struct {
	Algorithm string // "" inherits
	Limit     int64
	Window    time.Duration
	Burst     int64
}

// LayerThrottle cuts effective limits by Percent (0 to 100) until
// ExpiresAt: of every check (scope "global"), of the instances of one
// region (scope "region", Target the region) or of one client (scope
// "client", Target the client id).
type LayerThrottle struct {
	ID        string
	Scope     string
	Target    string
	Percent   float64
	ExpiresAt time.Time
}
