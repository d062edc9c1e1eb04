package policy

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyspace"
)

// DescriptorEntry is one key/value pair of an Envoy rate-limit descriptor.
type DescriptorEntry struct{ Key, Value string }

// EnvoyLimit is the rate_limit block of one descriptor of an
// envoyproxy/ratelimit configuration. It is immutable.
type EnvoyLimit struct {
	// Domain is the configuration's domain.
	Domain string
	// FullKey names the configuration entry as envoyproxy/ratelimit does,
	// such as "messaging.message_type_marketing.to_number", for metrics.
	FullKey string
	// Name is the rate_limit's optional name, which `replaces` refers to.
	Name string
	// Replaces lists the names of the limits this one replaces when both
	// apply to one request.
	Replaces []string
	// Unit is the window: a second, minute, hour, day, week, month (30
	// days) or year (365 days); UnitName its configured name.
	Unit     time.Duration
	UnitName string
	// RequestsPerUnit is the limit; 0 denies everything. For a limit with
	// global_requests_per_unit alone (see GlobalOnly) it is that global
	// limit, which the descriptor's status reports.
	RequestsPerUnit int64
	// Unlimited descriptors are never limited and never reach the store.
	Unlimited bool
	// Shadow limits decide and report but always answer OK.
	Shadow bool
	// DetailedMetric asks for metrics per descriptor value.
	DetailedMetric bool
	// ValueToMetric asks for the descriptor's values in the metric's name
	// (envoyproxy/ratelimit's value_to_metric).
	ValueToMetric bool
	// QuotaMode limits are quotas: one over its limit is reported
	// OVER_LIMIT in its own status, but the request as a whole is over the
	// limit only when every quota mode descriptor of it is (or another,
	// ordinary, descriptor is).
	QuotaMode bool
	// Limit is the compiled limit (fixed window unless the rate_limit sets
	// Sluice's `algorithm` extension); nil when Unlimited or GlobalOnly.
	Limit *Limit
	// FailureMode is what the limit does when the store cannot answer:
	// DefaultFailureMode (local, with the whole limit per instance, as
	// an Envoy file names no expected instances).
	FailureMode FailureMode
	// Global is the limit's global_requests_per_unit, Sluice's extension:
	// the hits per unit every region together admits, compiled as a fixed
	// window of the unit; nil when not set (see Rule.Global).
	Global *algorithm.Params

	keyPrefix    string // keyspace.EnvoyPrefix(domain, tag)
	globalPrefix string // keyspace.EnvoyPrefix(domain, keyspace.GlobalTag), with Global
	// shared holds, by descriptor entry, the wildcard whose
	// share_threshold makes all the values it matches share one counter,
	// or ""; nil when no entry's does.
	shared []string
}

type envoyDomain struct {
	name string
	root envoyNode

	// overrides caches the limits compiled for descriptors' limit
	// overrides (see EnvoyOverride): read without a lock, replaced by a
	// copy under mu when an override is first seen.
	overrides atomic.Pointer[map[envoyOverride]*EnvoyLimit]
	mu        sync.Mutex
}

// envoyOverride is a descriptor's limit override: requests per window.
type envoyOverride struct {
	requests int64
	window   time.Duration
}

// MaxEnvoyOverrides bounds the limit overrides compiled and kept per Envoy
// domain; an override beyond them is compiled at each request.
const MaxEnvoyOverrides = 1024

// envoyNode is one level of nested descriptors.
type envoyNode struct {
	keys map[string]*envoyKey
}

type envoyKey struct {
	// values holds the entries by value as written, wildcards included:
	// a value spelled as a wildcard is, literally, that wildcard's.
	values    map[string]*envoyEntry
	wildcards wildcardIndex // values holding '*'
	any       *envoyEntry   // the entry without a value
}

type envoyEntry struct {
	limit    *EnvoyLimit
	children envoyNode
}

var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// Domains returns the Envoy domains the policy holds.
func (p *Policy) Domains() []string {
	out := make([]string, 0, len(p.envoy))
	for name := range p.envoy {
		out = append(out, name)
	}
	return out
}

// EnvoyLimit returns the limit of the descriptor entries in domain, or nil
// when none applies, with envoyproxy/ratelimit's semantics: the entries are
// matched in order, one nesting level each; at each level an entry with
// the same key and value wins, then the first in file order whose value
// holds '*' and matches the value, each '*' standing for any run of
// characters ("foo*", "*bar", "foo*bar", "a*b*c"), then one with the key
// and no value; the limit is that of the entry matched by the last descriptor
// entry. A descriptor with more entries than the configuration has levels
// gets no limit.
func (p *Policy) EnvoyLimit(domain string, entries []DescriptorEntry) *EnvoyLimit {
	dom := p.envoy[domain]
	if dom == nil || len(entries) == 0 {
		return nil
	}
	n := &dom.root
	for i, e := range entries {
		k := n.keys[e.Key]
		if k == nil {
			return nil
		}
		next := k.values[e.Value]
		if next == nil && k.wildcards.n > 0 {
			next = k.wildcards.match(e.Value)
		}
		if next == nil {
			next = k.any
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			return next.limit
		}
		if len(next.children.keys) == 0 {
			return nil
		}
		n = &next.children
	}
	return nil
}

// EnvoyOverride returns the limit an Envoy descriptor asks for with its
// limit override, requestsPerUnit per window counted on fixed windows, in
// place of the configured one; nil when the policy has no such domain, as
// in envoyproxy/ratelimit. requestsPerUnit is 1 to math.MaxUint32, and
// window at most sluice.MaxWindow; an error says which is wrong, or that
// the limit cannot be counted exactly.
//
// The limit has no name and replaces nothing; its FullKey is the domain
// followed by ".limit_override". Its store key (see AppendKey) is apart
// from those of configured limits and, as theirs, holds the window but not
// the requests per unit: a descriptor whose override changes keeps its
// count. Compiled limits are kept with the policy, up to
// MaxEnvoyOverrides per domain. It is safe for concurrent use.
func (p *Policy) EnvoyOverride(domain string, requestsPerUnit int64, window time.Duration) (*EnvoyLimit, error) {
	dom := p.envoy[domain]
	if dom == nil {
		return nil, nil
	}
	k := envoyOverride{requestsPerUnit, window}
	if m := dom.overrides.Load(); m != nil {
		if l := (*m)[k]; l != nil {
			return l, nil
		}
	}
	l, err := dom.compileOverride(k)
	if err != nil {
		return nil, err
	}
	dom.mu.Lock()
	defer dom.mu.Unlock()
	old := dom.overrides.Load()
	if old != nil {
		if cached := (*old)[k]; cached != nil {
			return cached, nil
		}
		if len(*old) >= MaxEnvoyOverrides {
			return l, nil
		}
	}
	m := make(map[envoyOverride]*EnvoyLimit, 1+lenOf(old))
	if old != nil {
		for ok, ol := range *old {
			m[ok] = ol
		}
	}
	m[k] = l
	dom.overrides.Store(&m)
	return l, nil
}

func lenOf(m *map[envoyOverride]*EnvoyLimit) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// compileOverride compiles the limit of override k in dom.
func (dom *envoyDomain) compileOverride(k envoyOverride) (*EnvoyLimit, error) {
	switch {
	case k.requests < 1 || k.requests > math.MaxUint32:
		return nil, fmt.Errorf("requests_per_unit: must be between 1 and %d, got %d", uint32(math.MaxUint32), k.requests)
	case k.window <= 0 || k.window > sluice.MaxWindow:
		return nil, fmt.Errorf("unit: the window must be longer than 0 and at most %s, got %s", sluice.MaxWindow, k.window)
	}
	// At the quantum of the largest override of this window, so that the
	// key's tag depends on the window alone (Compile's finest quantum
	// depends on the requests per unit too): 10 µs for a second, 1 ms for
	// a minute, a second for a day.
	largest, err := algorithm.Compile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: math.MaxUint32, Window: k.window})
	q := largest.Quantum
	if err != nil {
		q = 1_000_000 // too long a window for the largest: the coarsest
	}
	params, err := algorithm.CompileAt(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: k.requests, Window: k.window}, q)
	if err != nil {
		return nil, err
	}
	lim := &Limit{Spec: sluice.Limit{Algorithm: sluice.FixedWindow, Limit: k.requests, Window: k.window}}
	for pr := range lim.Params {
		lim.Params[pr] = params
		lim.Local[pr] = params // the whole limit per instance, as for the file's limits
	}
	lim.Tag = layoutTag(sluice.FixedWindow, &params)
	return &EnvoyLimit{Domain: dom.name, FullKey: dom.name + ".limit_override", Unit: k.window,
		RequestsPerUnit: k.requests, Limit: lim, FailureMode: DefaultFailureMode,
		keyPrefix: keyspace.EnvoyOverridePrefix(dom.name, lim.Tag)}, nil
}

// limits appends the compiled limits under n to out.
func (n *envoyNode) limits(out *[]*Limit) {
	for _, k := range n.keys {
		entries := make([]*envoyEntry, 0, len(k.values)+1)
		for _, e := range k.values {
			entries = append(entries, e)
		}
		if k.any != nil {
			entries = append(entries, k.any)
		}
		for _, e := range entries {
			if e.limit != nil && e.limit.Limit != nil {
				*out = append(*out, e.limit.Limit)
			}
			e.children.limits(out)
		}
	}
}

// GlobalOnly reports whether l's one limit is its global limit
// (global_requests_per_unit without requests_per_unit): a descriptor of it
// is decided by the global limit alone, on one key.
func (l *EnvoyLimit) GlobalOnly() bool { return l.Global != nil && l.Limit == nil }

// AppendKey appends the store key of l for the descriptor entries to dst.
// An entry matched by a wildcard with share_threshold is keyed by the
// wildcard, not by its value, so that all the values it matches share one
// counter. A key longer than MaxKeyBytes is shortened (see Rule.AppendKey).
func (l *EnvoyLimit) AppendKey(dst []byte, entries []DescriptorEntry) []byte {
	return l.appendKey(dst, l.keyPrefix, entries)
}

// AppendGlobalKey appends the store key of l's global limit for entries to
// dst, as AppendKey does for l: the same in every region.
func (l *EnvoyLimit) AppendGlobalKey(dst []byte, entries []DescriptorEntry) []byte {
	return l.appendKey(dst, l.globalPrefix, entries)
}

func (l *EnvoyLimit) appendKey(dst []byte, prefix string, entries []DescriptorEntry) []byte {
	start := len(dst)
	dst = append(dst, prefix...)
	for i, e := range entries {
		v := e.Value
		if i < len(l.shared) && l.shared[i] != "" {
			v = l.shared[i]
		}
		dst = keyspace.AppendEnvoyEntry(dst, i, e.Key, v)
	}
	return keyspace.Shorten(keyspace.CloseHashTag(dst), start)
}

// ValidateDescriptor reports a problem with Envoy descriptor entries that
// the engine refuses: no entries, or an empty key.
func ValidateDescriptor(entries []DescriptorEntry) error {
	if len(entries) == 0 {
		return fmt.Errorf("descriptor has no entries")
	}
	for _, e := range entries {
		if e.Key == "" {
			return fmt.Errorf("descriptor entry has an empty key")
		}
	}
	return nil
}
