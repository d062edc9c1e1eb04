package policy

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
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
	// RequestsPerUnit is the limit; 0 denies everything.
	RequestsPerUnit int64
	// Unlimited descriptors are never limited and never reach the store.
	Unlimited bool
	// Shadow limits decide and report but always answer OK.
	Shadow bool
	// DetailedMetric asks for metrics per descriptor value.
	DetailedMetric bool
	// Limit is the compiled limit (fixed window unless the rate_limit sets
	// Sluice's `algorithm` extension); nil when Unlimited.
	Limit *Limit
	// FailureMode is what the limit does when the store cannot answer:
	// DefaultFailureMode (local, with the whole limit per instance, as
	// an Envoy file names no expected instances).
	FailureMode FailureMode

	keyPrefix string // "rl:envoy:" + escaped domain + ":" + tag + ":"
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
	values    map[string]*envoyEntry // value-specific entries
	wildcards []envoyWildcard        // values ending in '*', in file order
	any       *envoyEntry            // the entry without a value
}

type envoyWildcard struct {
	prefix string
	entry  *envoyEntry
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
// the same key and value wins, then one whose value ends in '*' and
// prefixes the value (first in file order), then one with the key and no
// value; the limit is that of the entry matched by the last descriptor
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
		if next == nil {
			for _, w := range k.wildcards {
				if strings.HasPrefix(e.Value, w.prefix) {
					next = w.entry
					break
				}
			}
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
		keyPrefix: "rl:envoy:" + string(appendEscaped(nil, dom.name)) + ":override." + lim.Tag + ":"}, nil
}

// limits appends the compiled limits under n to out.
func (n *envoyNode) limits(out *[]*Limit) {
	for _, k := range n.keys {
		entries := make([]*envoyEntry, 0, len(k.values)+len(k.wildcards)+1)
		for _, e := range k.values {
			entries = append(entries, e)
		}
		for _, w := range k.wildcards {
			entries = append(entries, w.entry)
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

// AppendKey appends the store key of l for the descriptor entries to dst.
// A key longer than MaxKeyBytes is shortened (see Rule.AppendKey).
func (l *EnvoyLimit) AppendKey(dst []byte, entries []DescriptorEntry) []byte {
	start := len(dst)
	dst = append(dst, l.keyPrefix...)
	dst = append(dst, '{')
	for i, e := range entries {
		if i > 0 {
			dst = append(dst, ':')
		}
		// A '=' in the key would make {a=b=c} the key of both
		// {a: "b=c"} and {"a=b": "c"}: it is written %3D.
		k := e.Key
		for {
			before, after, found := strings.Cut(k, "=")
			dst = appendEscaped(dst, before)
			if !found {
				break
			}
			dst, k = append(dst, "%3D"...), after
		}
		dst = append(dst, '=')
		dst = appendEscaped(dst, e.Value)
	}
	return shorten(append(dst, '}'), start)
}

// envoyDomain decodes one envoyproxy/ratelimit configuration.
func (d *decoder) envoyDomain(n *yaml.Node) *envoyDomain {
	fs := d.fields(n, "envoy configuration", "domain", "descriptors")
	if fs == nil {
		return nil
	}
	dom := &envoyDomain{}
	var descs *yaml.Node
	for _, f := range fs {
		switch f.key {
		case "domain":
			dom.name, _ = d.str(f.v, "domain")
		case "descriptors":
			descs = f.v
		}
	}
	if dom.name == "" {
		d.errorf(n, "domain: must not be empty")
		return nil
	}
	st := &settings{alg: sluice.FixedWindow, high: 1, low: 1}
	d.envoyDescriptors(descs, dom, &dom.root, dom.name, st)
	return dom
}

var envoyDescriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric"}

func (d *decoder) envoyDescriptors(n *yaml.Node, dom *envoyDomain, into *envoyNode, parent string, st *settings) {
	for _, item := range d.seq(n, "descriptors") {
		fs := d.fields(item, "descriptor", envoyDescriptorKeys...)
		if fs == nil {
			continue
		}
		var key, value string
		var hasKey bool
		var rl, children *yaml.Node
		var shadow, detailed bool
		for _, f := range fs {
			switch f.key {
			case "key":
				key, hasKey = d.str(f.v, "descriptor.key")
			case "value":
				value, _ = d.str(f.v, "descriptor.value")
			case "rate_limit":
				rl = f.v
			case "descriptors":
				children = f.v
			case "shadow_mode":
				shadow, _ = d.bool(f.v, "descriptor.shadow_mode")
			case "detailed_metric":
				detailed, _ = d.bool(f.v, "descriptor.detailed_metric")
			}
		}
		if !hasKey || key == "" {
			d.errorf(item, "descriptor has an empty key")
			continue
		}
		full := key
		if value != "" {
			full += "_" + value
		}
		full = parent + "." + full
		if into.keys == nil {
			into.keys = map[string]*envoyKey{}
		}
		k := into.keys[key]
		if k == nil {
			k = &envoyKey{}
			into.keys[key] = k
		}
		e := &envoyEntry{}
		switch {
		case value == "":
			if k.any != nil {
				d.errorf(item, "duplicate descriptor composite key %q", full)
				continue
			}
			k.any = e
		case strings.HasSuffix(value, "*"):
			prefix := strings.TrimSuffix(value, "*")
			dup := false
			for _, w := range k.wildcards {
				dup = dup || w.prefix == prefix
			}
			if dup {
				d.errorf(item, "duplicate descriptor composite key %q", full)
				continue
			}
			k.wildcards = append(k.wildcards, envoyWildcard{prefix: prefix, entry: e})
		default:
			if k.values == nil {
				k.values = map[string]*envoyEntry{}
			}
			if _, dup := k.values[value]; dup {
				d.errorf(item, "duplicate descriptor composite key %q", full)
				continue
			}
			k.values[value] = e
		}
		if rl != nil {
			e.limit = d.envoyLimit(rl, dom, full, st)
			if e.limit != nil {
				e.limit.Shadow, e.limit.DetailedMetric = shadow, detailed
			}
		}
		if children != nil {
			d.envoyDescriptors(children, dom, &e.children, full, st)
		}
	}
}

var envoyRateLimitKeys = []string{"unit", "requests_per_unit", "name", "replaces", "unlimited", "algorithm"}

func (d *decoder) envoyLimit(n *yaml.Node, dom *envoyDomain, full string, st *settings) *EnvoyLimit {
	fs := d.fields(n, "rate_limit", envoyRateLimitKeys...)
	if fs == nil {
		return nil
	}
	l := &EnvoyLimit{Domain: dom.name, FullKey: full, FailureMode: DefaultFailureMode}
	// has* report the fields given, bad that one was reported as invalid.
	var hasUnit, hasRPU, bad bool
	alg := sluice.FixedWindow
	for _, f := range fs {
		switch f.key {
		case "unit":
			hasUnit = true
			s, ok := d.str(f.v, "rate_limit.unit")
			if !ok {
				bad = true
				continue
			}
			u, known := envoyUnits[strings.ToLower(s)]
			if !known {
				d.errorf(f.v, "rate_limit.unit: invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", s)
				bad = true
				continue
			}
			l.Unit, l.UnitName = u, strings.ToLower(s)
		case "requests_per_unit":
			hasRPU = true
			v, ok := d.int64(f.v, "rate_limit.requests_per_unit")
			if !ok {
				bad = true
				continue
			}
			if v < 0 || v > math.MaxUint32 {
				d.errorf(f.v, "rate_limit.requests_per_unit: must be between 0 and %d, got %d", uint32(math.MaxUint32), v)
				bad = true
				continue
			}
			l.RequestsPerUnit = v
		case "name":
			l.Name, _ = d.str(f.v, "rate_limit.name")
		case "replaces":
			for _, r := range d.seq(f.v, "rate_limit.replaces") {
				for _, rf := range d.fields(r, "rate_limit.replaces[]", "name") {
					s, ok := d.str(rf.v, "rate_limit.replaces[].name")
					if ok && s == "" {
						d.errorf(rf.v, "rate_limit.replaces: name must not be empty")
						continue
					}
					if ok {
						l.Replaces = append(l.Replaces, s)
					}
				}
			}
		case "unlimited":
			l.Unlimited, _ = d.bool(f.v, "rate_limit.unlimited")
		case "algorithm":
			if a, ok := d.algorithm(f.v, "rate_limit.algorithm"); ok {
				alg = a
			} else {
				bad = true
			}
		}
	}
	if l.Unlimited {
		if hasUnit || hasRPU {
			d.errorf(n, "rate_limit: an unlimited rate limit must not set unit or requests_per_unit")
			return nil
		}
		return l
	}
	if !hasUnit {
		d.errorf(n, "rate_limit: missing unit")
		return nil
	}
	if !hasRPU {
		d.errorf(n, "rate_limit: missing requests_per_unit")
		return nil
	}
	if bad {
		return nil
	}
	spec := limitSpec{alg: alg, limit: l.RequestsPerUnit, window: l.Unit, hasLim: true, hasWin: true, node: n}
	if l.RequestsPerUnit == 0 {
		// requests_per_unit: 0 blocks every request (envoyproxy/ratelimit's
		// way of listing a banned value).
		lim := &Limit{Spec: sluice.Limit{Algorithm: alg, Window: l.Unit, DenyAll: true}}
		for pr := range lim.Params {
			p, err := algorithm.Compile(lim.Spec)
			if err != nil {
				d.errorf(n, "rate_limit: %v", err)
				return nil
			}
			lim.Params[pr] = p
		}
		lim.Tag = algorithmAbbrev[alg] + "." + l.Unit.String()
		l.Limit = lim
	} else {
		l.Limit = d.compile(spec, st, DefaultFailureMode, 1, "rate_limit", 1)
		if l.Limit == nil {
			return nil
		}
	}
	l.keyPrefix = "rl:envoy:" + string(appendEscaped(nil, dom.name)) + ":" + l.Limit.Tag + ":"
	return l
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
