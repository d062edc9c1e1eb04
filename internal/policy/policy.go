// Package policy holds Sluice's rules, tiers and overrides: it parses and
// validates their YAML configuration (Sluice's own format and
// envoyproxy/ratelimit's), and matches a check to the rules that apply.
//
// A Policy is built once, validated whole, and never modified afterwards:
// every limit is compiled (algorithm.Compile) when the policy is loaded, so
// deciding a check only looks values up. The format is documented in
// docs/config.md.
package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// ErrInvalidConfig is wrapped by every error about a configuration file.
// The individual problems are *ConfigError values, joined with errors.Join.
var ErrInvalidConfig = errors.New("sluice: invalid configuration")

// ConfigError is one problem in a configuration file, with its position.
type ConfigError struct {
	// File is the name given to Parse.
	File string
	// Line and Column are 1-based; 0 when unknown.
	Line, Column int
	// Msg says what is wrong.
	Msg string
}

// Error implements error as "file:line:column: msg", without the column
// or the line when they are unknown.
func (e *ConfigError) Error() string {
	switch {
	case e.Line == 0:
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	case e.Column == 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Priority is how urgent a check is; it selects one of the compiled
// variants of a limit (see Limit.Params). The engine re-exports it.
type Priority uint8

// The priorities, in the order of Limit.Params.
const (
	PriorityNormal Priority = iota
	PriorityHigh
	PriorityLow
	numPriorities
)

var priorityNames = [...]string{PriorityNormal: "normal", PriorityHigh: "high", PriorityLow: "low"}

// String returns the wire name of p: "normal", "high" or "low".
func (p Priority) String() string {
	if int(p) < len(priorityNames) {
		return priorityNames[p]
	}
	return "unknown"
}

// ParsePriority returns the priority named s; the empty string is normal.
func ParsePriority(s string) (Priority, bool) {
	switch s {
	case "", "normal":
		return PriorityNormal, true
	case "high":
		return PriorityHigh, true
	case "low":
		return PriorityLow, true
	}
	return 0, false
}

// FailureMode says what a rule does when the store cannot answer.
type FailureMode uint8

// The failure modes.
const (
	// FailOpen admits the request, without a bound: only when a rule or
	// the defaults say so.
	FailOpen FailureMode = iota + 1
	// FailClosed refuses the request as unavailable.
	FailClosed
	// FailLocal decides from an in-process limiter holding
	// limit/expected_instances of the limit (the default: an outage of
	// the store neither takes the API down nor lifts the limit).
	FailLocal
)

var failureModeNames = [...]string{FailOpen: "fail_open", FailClosed: "fail_closed", FailLocal: "local"}

// String returns the configuration name of m.
func (m FailureMode) String() string {
	if m != 0 && int(m) < len(failureModeNames) {
		return failureModeNames[m]
	}
	return "unknown"
}

// Dimension is one part of what a rule counts by.
type Dimension uint8

// The dimensions. A rule's dimension is one of them or a composite such as
// user+endpoint.
const (
	DimClient Dimension = iota + 1
	DimUser
	DimIP
	DimAPIKey
	DimEndpoint
	DimMethod
	DimOperation
	DimGlobal
)

var dimensionNames = [...]string{
	DimClient: "client", DimUser: "user", DimIP: "ip", DimAPIKey: "api_key",
	DimEndpoint: "endpoint", DimMethod: "method", DimOperation: "operation", DimGlobal: "global",
}

// String returns the configuration name of d, such as "api_key".
func (d Dimension) String() string {
	if d != 0 && int(d) < len(dimensionNames) {
		return dimensionNames[d]
	}
	return "unknown"
}

func parseDimension(s string) (Dimension, bool) {
	for d := DimClient; d <= DimGlobal; d++ {
		if dimensionNames[d] == s {
			return d, true
		}
	}
	return 0, false
}

// Request is what the policy needs of a check to match rules and build
// keys. The engine fills it from its Check.
type Request struct {
	ClientID, User, IP, APIKey  string
	Resource, Method, Operation string
}

// value returns the value of dimension d in r; "" when r does not carry it.
func (r *Request) value(d Dimension) string {
	switch d {
	case DimClient:
		return r.ClientID
	case DimUser:
		return r.User
	case DimIP:
		return r.IP
	case DimAPIKey:
		return r.APIKey
	case DimEndpoint:
		return r.Resource
	case DimMethod:
		return r.Method
	case DimOperation:
		return r.Operation
	case DimGlobal:
		return "*"
	}
	return ""
}

// Limit is one compiled limit: the configured value and its compiled
// variants per priority. It is immutable.
type Limit struct {
	// Spec is the limit as configured (for the normal priority).
	Spec sluice.Limit
	// Params holds the compiled limit per Priority: normal as configured,
	// high and low scaled by the priority multipliers. All three share
	// one algorithm, window and quantum, so they may share state; their
	// ExpiryLimit is the smallest of their limits (algorithm.ShareState).
	Params [numPriorities]algorithm.Params
	// Local holds, per Priority, the share of the limit an instance
	// enforces on its own when the rule's failure mode is local and the
	// store cannot answer: the limit divided by expected_instances,
	// rounded up. Its variants share state as those of Params do.
	Local [numPriorities]algorithm.Params
	// Tag identifies the state layout (algorithm, window, quantum) in
	// store keys, so that a key never changes algorithm or quantum.
	Tag string

	src *limitSource // what it was compiled from
}

// Rule is one rate-limiting rule. It is immutable once its Policy is built.
type Rule struct {
	// ID is the rule's unique id; Name its human name.
	ID, Name string
	// Index is the rule's position in the policy: rules apply and report
	// in this order.
	Index int
	// Resources, Methods and Operations are the match conditions; an empty
	// list matches anything.
	Resources, Methods, Operations []string
	// Clients are the client ids the rule applies to; empty applies to
	// every client. Case matters.
	Clients []string
	// Dimension is what the rule counts by: one entry, or several for a
	// composite such as user+endpoint.
	Dimension []Dimension
	// DimensionName is the dimension as configured, such as "user+endpoint".
	DimensionName string
	// Base is the rule's own limit; nil when the rule takes its limits
	// from the tiers only, or has only a global limit (see GlobalOnly).
	Base *Limit
	// Tiered reports that the limit depends on the identity's tier.
	Tiered bool
	// CostMultipliers maps an operation to the multiplier of the check's
	// cost; operations not listed cost 1x.
	CostMultipliers map[string]int64
	// Shadow rules decide and report, never deny.
	Shadow bool
	// FailureMode says what the rule does when the store cannot answer.
	FailureMode FailureMode
	// ExpectedInstances is the number of Sluice instances sharing the
	// store, for the local failure mode.
	ExpectedInstances int64
	// Global is the rule's global limit, compiled as a fixed window of
	// the rule's window, or nil: the units every region together admits,
	// on top of the rule's own limit in each region when it has one.
	Global *algorithm.Params
	// GlobalLocal is the share of the global limit that each instance
	// admits on its own while the store cannot answer, for a rule with
	// only a global limit and the local failure mode; nil otherwise.
	GlobalLocal *algorithm.Params
	// Reservations configures the pools of reservations the rule's own
	// limit makes: their queue limit and fairness quotas; nil for none
	// (the defaults, every client of weight 1).
	Reservations *Reservations

	byTier    map[string]*Limit // effective limit per tier name
	keyPrefix string            // keyspace.RulePrefix(ID)
}

// GlobalOnly reports whether the rule's one limit is its global limit: a
// check of it is decided by the global limit alone, one store key.
func (r *Rule) GlobalOnly() bool { return r.Global != nil && r.Base == nil && !r.Tiered }

// LimitFor returns the limit that applies under tier, with the override of
// assignment a (may be nil) taking precedence. It returns nil when the rule
// has no limit for that tier. It ignores the layer's overrides: use LimitAt
// with what Lookup returned.
func (r *Rule) LimitFor(tier string, a *Assignment) *Limit {
	if a != nil {
		if l, ok := a.Limits[r.ID]; ok {
			return l
		}
	}
	if r.Tiered || len(r.byTier) > 0 {
		if l, ok := r.byTier[tier]; ok {
			return l
		}
	}
	return r.Base
}

// Limits returns every distinct limit the rule may apply (base, per tier),
// for status and reset.
func (r *Rule) Limits() []*Limit {
	var out []*Limit
	seen := map[*Limit]bool{}
	add := func(l *Limit) {
		if l != nil && !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	add(r.Base)
	for _, l := range r.byTier {
		add(l)
	}
	return out
}

// Cost returns the cost the rule charges for a check of base cost and
// operation op, and false when it overflows sluice.MaxLimit.
func (r *Rule) Cost(op string, base int64) (int64, bool) {
	m, ok := r.CostMultipliers[op]
	if !ok {
		return base, true
	}
	if m != 0 && base > sluice.MaxLimit/m {
		return 0, false
	}
	return base * m, true
}

// Tier is a named class of identities with default limits.
type Tier struct {
	// Name is the tier's name, such as "premium".
	Name string
	// Limit is the tier's default limit for rules marked tiered.
	Limit *Limit
}

// Assignment gives one identity a tier and, optionally, its own limits for
// some rules, until an optional expiry.
type Assignment struct {
	// Kind is DimClient, DimUser or DimAPIKey.
	Kind Dimension
	// Value is the identity, such as the client id.
	Value string
	// Tier is the assigned tier; "" keeps the default tier.
	Tier string
	// Limits overrides the limit of the rules it names (by rule id).
	Limits map[string]*Limit
	// ExpiresAt is when the assignment stops applying; zero never.
	ExpiresAt time.Time

	// The layer's view of the identity (see WithLayer): its overrides,
	// newest first, and the file's assignments of the identity.
	layered   bool
	overrides []*override
	base      []*Assignment
}

// active reports whether a applies at now.
func (a *Assignment) active(now time.Time) bool {
	return a.ExpiresAt.IsZero() || now.Before(a.ExpiresAt)
}

// identitySet is an allow or deny list.
type identitySet struct {
	byKind   [DimGlobal + 1]map[string]bool
	prefixes []netip.Prefix
}

func (s *identitySet) empty() bool {
	for _, m := range s.byKind {
		if len(m) > 0 {
			return false
		}
	}
	return len(s.prefixes) == 0
}

func (s *identitySet) add(d Dimension, v string) {
	if s.byKind[d] == nil {
		s.byKind[d] = map[string]bool{}
	}
	s.byKind[d][v] = true
}

func (s *identitySet) contains(r *Request) bool {
	if s.empty() {
		return false
	}
	for _, d := range [...]Dimension{DimClient, DimUser, DimAPIKey, DimIP} {
		v := r.value(d)
		if v != "" && s.byKind[d][v] {
			return true
		}
	}
	if len(s.prefixes) > 0 && r.IP != "" {
		if addr, err := netip.ParseAddr(r.IP); err == nil {
			// A prefix contains no address with a zone (fe80::1%eth0).
			addr = addr.WithZone("").Unmap()
			for _, p := range s.prefixes {
				if p.Contains(addr) {
					return true
				}
			}
		}
	}
	return false
}

// Policy is a validated, immutable set of rules, tiers and overrides. It is
// safe to share between goroutines.
type Policy struct {
	// Version identifies the configuration's contents, for status and
	// metrics: "builtin" for Default, otherwise the first 12 hex digits of
	// the SHA-256 of the file.
	Version string
	// Schema is the configuration format's version (the `version:` key);
	// 1 for the only format so far. Envoy files have schema 0.
	Schema int
	// Source is the name the policy was parsed from.
	Source string
	// Rules are the rules in configuration order.
	Rules []*Rule
	// Tiers are the tiers by name; DefaultTier applies to identities
	// without an active assignment.
	Tiers       map[string]*Tier
	DefaultTier string

	assignments [DimGlobal + 1]map[string][]*Assignment
	allow, deny identitySet
	matcher     *matcher
	envoy       map[string]*envoyDomain
	// st holds the file's defaults and tiers, to decode the layer's
	// rules as the file's; nil for Envoy files.
	st *settings
	// layer is the control plane's layer applied (see WithLayer); nil
	// for the file's own policy.
	layer *layerState
}

// Limits returns every compiled limit of the policy: rules (base and per
// tier), tiers, overrides and Envoy limits, so that a store can be checked
// to accept them all before the policy is applied.
func (p *Policy) Limits() []*Limit {
	var out []*Limit
	for _, r := range p.Rules {
		out = append(out, r.Limits()...)
	}
	for _, t := range p.Tiers {
		out = append(out, t.Limit)
	}
	for _, m := range p.assignments {
		for _, as := range m {
			for _, a := range as {
				for _, l := range a.Limits {
					out = append(out, l)
				}
			}
		}
	}
	for _, dom := range p.envoy {
		dom.root.limits(&out)
	}
	if p.layer != nil {
		for i := range p.layer.ids {
			p.layer.ids[i].all(func(_ string, a *Assignment) bool {
				for _, o := range a.overrides {
					for _, rl := range o.limits {
						out = append(out, rl.l)
					}
				}
				return true
			})
		}
	}
	return out
}

// Allowed reports whether r's identity is on the allow list: never limited.
func (p *Policy) Allowed(r *Request) bool { return p.allow.contains(r) }

// Denied reports whether r's identity is on the deny list: always denied.
// The deny list wins over the allow list.
func (p *Policy) Denied(r *Request) bool { return p.deny.contains(r) }

// Lookup returns the tier of r at now and the assignment that gave it,
// if any. The identities are tried in the order api_key, user, client; the
// first with an active assignment decides (one in the layer, a tier or an
// active override, counts as active). Without one, the default tier
// applies. Pass the assignment to Rule.LimitAt.
func (p *Policy) Lookup(r *Request, now time.Time) (tier string, a *Assignment) {
	for _, d := range [...]Dimension{DimAPIKey, DimUser, DimClient} {
		v := r.value(d)
		if v == "" {
			continue
		}
		if p.layer != nil {
			if la, _ := p.layer.ids[d].get(v); la != nil {
				if t, ok := la.tierAt(now); ok {
					if t == "" {
						t = p.DefaultTier
					}
					return t, la
				}
				continue
			}
		}
		for _, as := range p.assignments[d][v] {
			if as.active(now) {
				t := as.Tier
				if t == "" {
					t = p.DefaultTier
				}
				return t, as
			}
		}
	}
	return p.DefaultTier, nil
}

// Parse parses and validates a configuration file's contents; name is used
// in errors ("name:line: ..."). It accepts Sluice's format and
// envoyproxy/ratelimit's (recognised by its top-level `domain` key). The
// error wraps ErrInvalidConfig and joins one *ConfigError per problem.
func Parse(name string, data []byte) (p *Policy, err error) {
	defer func() {
		// A bad file must not take the process down, whatever it
		// makes panic: yaml.v3's are recovered in parse, and the
		// decoder's, which FuzzParse looks for, here.
		if r := recover(); r != nil {
			p, err = nil, &ConfigError{File: name, Msg: fmt.Sprintf("cannot parse: %v", r)}
		}
	}()
	return parse(name, data)
}

// Default returns the built-in example policy that `sluice serve` uses with
// no configuration: tiers and several algorithms. Its text is DefaultYAML.
func Default() *Policy {
	p, err := Parse("builtin", []byte(DefaultYAML))
	if err != nil {
		// DefaultYAML is a constant checked by the tests; reaching this
		// is a bug in this package.
		panic("policy: built-in policy is invalid: " + err.Error())
	}
	p.Version = "builtin"
	return p
}

// DefaultYAML is the built-in policy, in Sluice's configuration format.
const DefaultYAML = `# Sluice's built-in example policy.
version: 1

defaults:
  algorithm: sliding_window_counter
  failure_mode: fail_open

default_tier: free
tiers:
  free:       { limit: 10,    window: 1s }
  basic:      { limit: 100,   window: 1s }
  premium:    { limit: 1000,  window: 1s, algorithm: token_bucket, burst: 2000 }
  enterprise: { limit: 10000, window: 1s, algorithm: token_bucket, burst: 20000 }

rules:
  # Try it: 5 requests per minute per client on /api/v1/demo, then 429.
  - id: demo
    name: Demo endpoint, 5 per minute per client
    match: { resource: /api/v1/demo }
    dimension: client
    algorithm: fixed_window
    limit: 5
    window: 1m

  # Every client gets its tier's rate on the whole API.
  - id: api-per-client
    name: Per-client rate by tier
    match: { resource: "/api/*" }
    dimension: client
    tiered: true

  # Writes and deletes cost more (write 5x, delete 10x).
  - id: orders-per-user
    name: Orders per user and endpoint
    match: { resource: "/api/v1/orders/*", method: [POST, PUT, DELETE] }
    dimension: user+endpoint
    algorithm: token_bucket
    limit: 60
    window: 1m
    burst: 20

  # A smooth per-IP limit on logins.
  - id: login-per-ip
    name: Logins per IP
    match: { resource: /api/v1/login }
    dimension: ip
    algorithm: gcra
    limit: 10
    window: 1m
    burst: 5
    failure_mode: fail_closed
`
