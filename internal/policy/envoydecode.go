package policy

import (
	"math"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyspace"
)

// MaxEnvoyDepth bounds the nesting of Envoy descriptors.
const MaxEnvoyDepth = 32

// envoyEntryBytes is what a descriptor costs in memory beside its names
// and values, compiled limit included, for the bytes budget: each
// descriptor an alias repeats is built anew.
const envoyEntryBytes = 512

// envoyDomain decodes one envoyproxy/ratelimit configuration.
func (d *decoder) envoyDomain(n *yaml.Node) *envoyDomain {
	name, descs := d.envoyHead(n)
	if name == "" {
		return nil
	}
	dom := &envoyDomain{name: name}
	d.envoyInto(dom, descs)
	return dom
}

// envoyHead decodes the domain of an envoyproxy/ratelimit configuration,
// "" when it has none, and returns it with the node of its descriptors.
func (d *decoder) envoyHead(n *yaml.Node) (domain string, descs *yaml.Node) {
	fs := d.fields(n, "envoy configuration", "domain", "descriptors")
	if fs == nil {
		return "", nil
	}
	for _, f := range fs {
		switch f.key {
		case "domain":
			domain, _ = d.str(f.v, "domain")
		case "descriptors":
			descs = f.v
		}
	}
	if domain == "" {
		d.errorf(n, "domain: must not be empty")
	}
	return domain, descs
}

// envoyInto decodes the descriptors descs of dom's configuration into dom,
// beside those it holds (when a domain's configuration is merged from
// several files).
func (d *decoder) envoyInto(dom *envoyDomain, descs *yaml.Node) {
	st := &settings{alg: sluice.FixedWindow, high: 1, low: 1}
	d.envoyDescriptors(descs, dom, &dom.root, dom.name, st, nil)
}

var envoyDescriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
	"detailed_metric", "value_to_metric", "share_threshold", "metadata"}

// isNull reports whether n is YAML's null: a key given no value.
func isNull(n *yaml.Node) bool {
	n = resolve(n)
	return n != nil && n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// envoyDescriptors decodes the descriptors n into into; parent is the
// full key of the level above, and shared, by level, the wildcards above
// whose share_threshold is set.
func (d *decoder) envoyDescriptors(n *yaml.Node, dom *envoyDomain, into *envoyNode, parent string, st *settings, shared []string) {
	if isNull(n) {
		return // `descriptors:` with no value, as envoyproxy/ratelimit takes it
	}
	if len(shared) >= MaxEnvoyDepth {
		d.errorf(n, "descriptors: nested deeper than %d levels", MaxEnvoyDepth)
		return
	}
	for _, item := range d.seq(n, "descriptors") {
		fs := d.fields(item, "descriptor", envoyDescriptorKeys...)
		if fs == nil {
			continue
		}
		var key, value string
		var hasKey bool
		var rl, children, meta *yaml.Node
		var shadow, quota, detailed, toMetric, share bool
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
			case "quota_mode":
				quota, _ = d.bool(f.v, "descriptor.quota_mode")
			case "detailed_metric":
				detailed, _ = d.bool(f.v, "descriptor.detailed_metric")
			case "value_to_metric":
				toMetric, _ = d.bool(f.v, "descriptor.value_to_metric")
			case "share_threshold":
				share, _ = d.bool(f.v, "descriptor.share_threshold")
			case "metadata":
				meta = f.v
			}
		}
		if meta != nil && !isNull(meta) && resolve(meta).Kind != yaml.MappingNode {
			d.errorf(meta, "descriptor.metadata: want a mapping, got %s", kindName(resolve(meta)))
		}
		if !hasKey || key == "" {
			d.errorf(item, "descriptor has an empty key")
			continue
		}
		// The full key holds the parent's: its bytes are budgeted, since
		// deep nesting of long keys and values makes them grow with the
		// square of the depth.
		size := len(parent) + 1 + len(key)
		if value != "" {
			size += 1 + len(value)
		}
		if !d.spendBytes(item, size+len(value)+envoyEntryBytes) {
			return
		}
		full := key
		if value != "" {
			full += "_" + value
		}
		full = parent + "." + full
		if share && !strings.Contains(value, "*") {
			d.errorf(item, "descriptor.share_threshold: only a value holding '*' can share its counter, got key %q", full)
			continue
		}
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
		default:
			if k.values == nil {
				k.values = map[string]*envoyEntry{}
			}
			if _, dup := k.values[value]; dup {
				d.errorf(item, "duplicate descriptor composite key %q", full)
				continue
			}
			k.values[value] = e
			if strings.Contains(value, "*") {
				k.wildcards.add(value, e)
			}
		}
		level := append(shared[:len(shared):len(shared)], "")
		if share {
			level[len(level)-1] = value
		}
		if rl != nil {
			e.limit = d.envoyLimit(rl, dom, full, st)
			if e.limit != nil && e.limit.GlobalOnly() && (shadow || quota) {
				d.errorf(rl, "rate_limit.global_requests_per_unit: a shadow_mode or quota_mode descriptor does not enforce a global limit, and this one has no other; set requests_per_unit")
				e.limit = nil
			}
			if e.limit != nil {
				e.limit.Shadow, e.limit.QuotaMode = shadow, quota
				e.limit.DetailedMetric, e.limit.ValueToMetric = detailed, toMetric
				for _, p := range level {
					if p != "" {
						e.limit.shared = level
						break
					}
				}
			}
		}
		if children != nil {
			d.envoyDescriptors(children, dom, &e.children, full, st, level)
		}
	}
}

var envoyRateLimitKeys = []string{"unit", "requests_per_unit", "name", "replaces", "unlimited", "algorithm", "global_requests_per_unit"}

func (d *decoder) envoyLimit(n *yaml.Node, dom *envoyDomain, full string, st *settings) *EnvoyLimit {
	fs := d.fields(n, "rate_limit", envoyRateLimitKeys...)
	if fs == nil {
		return nil
	}
	l := &EnvoyLimit{Domain: dom.name, FullKey: full, FailureMode: DefaultFailureMode}
	// has* report the fields given, bad that one was reported as invalid.
	var hasUnit, hasRPU, hasAlg, bad bool
	var global *yaml.Node
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
		case "global_requests_per_unit":
			global = f.v
		case "algorithm":
			hasAlg = true
			if a, ok := d.algorithm(f.v, "rate_limit.algorithm"); ok {
				alg = a
			} else {
				bad = true
			}
		}
	}
	if l.Name != "" && slices.Contains(l.Replaces, l.Name) {
		d.errorf(n, "rate_limit.replaces: names %q, the rate limit's own name: it would disable itself", l.Name)
		return nil
	}
	if l.Unlimited {
		if hasUnit || hasRPU || global != nil {
			d.errorf(n, "rate_limit: an unlimited rate limit must not set unit, requests_per_unit or global_requests_per_unit")
			return nil
		}
		return l
	}
	if !hasUnit {
		d.errorf(n, "rate_limit: missing unit")
		return nil
	}
	if !hasRPU && global == nil {
		d.errorf(n, "rate_limit: missing requests_per_unit (or global_requests_per_unit for a limit shared by every region alone)")
		return nil
	}
	if !hasRPU && hasAlg {
		d.errorf(n, "rate_limit.algorithm: a rate limit with only global_requests_per_unit counts it in fixed windows; remove algorithm, or set requests_per_unit")
		return nil
	}
	if bad {
		return nil
	}
	if hasRPU {
		if !d.envoyOwnLimit(n, l, dom, st, alg) {
			return nil
		}
	}
	if global != nil {
		v, ok := d.int64(global, "rate_limit.global_requests_per_unit")
		if !ok {
			return nil
		}
		p, err := algorithm.Compile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: v, Window: l.Unit})
		if err != nil || v < 1 || v > math.MaxUint32 {
			d.errorf(global, "rate_limit.global_requests_per_unit: must be between 1 and %d, got %d", uint32(math.MaxUint32), v)
			return nil
		}
		l.Global = &p
		l.globalPrefix = keyspace.EnvoyPrefix(dom.name, keyspace.GlobalTag)
		if !hasRPU {
			// The global limit is the descriptor's only one, and the
			// one its status reports.
			l.RequestsPerUnit = v
		}
	}
	return l
}

// envoyOwnLimit compiles l's own limit, requests_per_unit per unit of
// algorithm alg, and reports whether it could.
func (d *decoder) envoyOwnLimit(n *yaml.Node, l *EnvoyLimit, dom *envoyDomain, st *settings, alg sluice.Algorithm) bool {
	spec := limitSpec{alg: alg, limit: l.RequestsPerUnit, window: l.Unit, hasLim: true, hasWin: true, node: n}
	if l.RequestsPerUnit == 0 {
		// requests_per_unit: 0 blocks every request (envoyproxy/ratelimit's
		// way of listing a banned value).
		lim := &Limit{Spec: sluice.Limit{Algorithm: alg, Window: l.Unit, DenyAll: true}}
		for pr := range lim.Params {
			p, err := algorithm.Compile(lim.Spec)
			if err != nil {
				d.errorf(n, "rate_limit: %v", err)
				return false
			}
			lim.Params[pr] = p
		}
		lim.Tag = keyspace.LayoutTag(alg, l.Unit.String(), 1)
		l.Limit = lim
	} else {
		l.Limit = d.compile(spec, st, DefaultFailureMode, 1, "rate_limit", 1)
		if l.Limit == nil {
			return false
		}
	}
	l.keyPrefix = keyspace.EnvoyPrefix(dom.name, l.Limit.Tag)
	return true
}
