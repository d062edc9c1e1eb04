// The decoder of the configuration file: either format's document, and in
// Sluice's own format the top level, the defaults and the tiers; the rules,
// the limits and the assignments are decoded in rules.go, limits.go and
// assignments.go.

package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
)

// Defaults of the configuration format.
const (
	DefaultAlgorithm   = sluice.SlidingWindowCounter
	DefaultFailureMode = FailLocal
	// MaxRules bounds the rules of one policy.
	MaxRules = 100_000
	// MaxLogLimit bounds the limit (at every priority) of a sliding window
	// log, which keeps one timestamp per admitted unit: the in-memory
	// store's default bound. Use sliding_window_counter for larger limits.
	MaxLogLimit = 10_000
)

// DefaultCostMultipliers are the cost multipliers by operation when the
// configuration sets none: read 1, write 5, delete 10.
func DefaultCostMultipliers() map[string]int64 {
	return map[string]int64{"read": 1, "write": 5, "delete": 10}
}

// Default priority multipliers.
const (
	DefaultHighMultiplier = 1.2
	DefaultLowMultiplier  = 0.8
)

// settings are the policy-wide values a compiled limit depends on.
type settings struct {
	alg         sluice.Algorithm
	failure     FailureMode
	instances   int64
	costs       map[string]int64
	high, low   float64
	tiers       map[string]limitSpec
	tierNames   []string
	defaultTier string
}

// parse parses either format.
func parse(name string, data []byte) (*Policy, error) {
	return parseWith(&decoder{file: name}, data)
}

// parseWith parses either format with d, whose budgets it spends.
func parseWith(d *decoder, data []byte) (*Policy, error) {
	name := d.file
	var doc yaml.Node
	more, err := unmarshal(data, &doc)
	if err != nil {
		return nil, syntaxError(name, err)
	}
	if more != nil {
		// yaml.v3 would ignore it: a policy, or Envoy domains, that
		// the file seems to hold and that would never apply.
		d.errorf(more, "a second YAML document: a file holds one policy (use the envoy: list for Envoy domains)")
		return nil, d.err()
	}
	root := resolve(&doc)
	if root != nil && root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			root = nil
		} else {
			root = resolve(root.Content[0])
		}
	}
	if root == nil || root.Kind != yaml.MappingNode {
		d.errorf(root, "the file must be a mapping with `version: 1` (Sluice) or `domain:` (envoyproxy/ratelimit)")
		return nil, d.err()
	}
	sum := sha256.Sum256(data)
	p := &Policy{Version: hex.EncodeToString(sum[:6]), Source: name, Tiers: map[string]*Tier{}}
	isEnvoy := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := resolve(root.Content[i]); k != nil && k.Value == "domain" {
			isEnvoy = true
		}
	}
	if isEnvoy {
		dom := d.envoyDomain(root)
		if dom != nil {
			p.envoy = map[string]*envoyDomain{dom.name: dom}
		}
	} else {
		d.sluice(root, p)
	}
	if err := d.err(); err != nil {
		return nil, err
	}
	p.matcher = newMatcher(p.Rules)
	return p, nil
}

// syntaxError returns yaml.v3's error err about file name as the
// *ConfigError of its line ("yaml: line 3: did not find expected key"
// becomes "name:3: yaml: did not find expected key"), joined as
// Parse's problems are.
func syntaxError(name string, err error) error {
	msg := clipTo(strings.TrimPrefix(err.Error(), "yaml: "), maxErrorMsg)
	e := &ConfigError{File: name, Msg: "yaml: " + msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, what, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil && n > 0 {
				e.Line, e.Msg = n, "yaml: "+what
			}
		}
	}
	return errors.Join(e)
}

// unmarshal decodes the first YAML document of data into doc (left zero
// when data holds none), and returns the first node of the first
// document after it that is not empty, if any. A panic of yaml.v3 (not
// ours) on a bad file is turned into an error.
func unmarshal(data []byte, doc *yaml.Node) (more *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			more, err = nil, fmt.Errorf("yaml: cannot parse: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	for {
		var next yaml.Node
		if err := dec.Decode(&next); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
		// A document of nothing ("---" at the end) holds a null.
		if n := resolve(&next); n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
			if c := n.Content[0]; c.Kind != yaml.ScalarNode || c.Tag != "!!null" || c.Value != "" {
				return c, nil
			}
		}
	}
}

var topKeys = []string{"version", "defaults", "default_tier", "tiers", "rules", "assignments", "allow", "deny", "envoy"}

// sluice decodes Sluice's own format into p.
func (d *decoder) sluice(root *yaml.Node, p *Policy) {
	fs := d.fields(root, "top level", topKeys...)
	byKey := map[string]field{}
	for _, f := range fs {
		byKey[f.key] = f
	}
	if f, ok := byKey["version"]; !ok {
		d.errorf(root, "missing `version: 1` at the top level")
	} else if v, ok := d.int64(f.v, "version"); ok {
		if v != 1 {
			d.errorf(f.v, "version: %d is not supported (want 1)", v)
		}
		p.Schema = int(v)
	}
	st := &settings{alg: DefaultAlgorithm, failure: DefaultFailureMode, instances: 1,
		costs: DefaultCostMultipliers(), high: DefaultHighMultiplier, low: DefaultLowMultiplier,
		tiers: map[string]limitSpec{}}
	if f, ok := byKey["defaults"]; ok {
		d.defaults(f.v, st)
	}
	if f, ok := byKey["tiers"]; ok {
		for _, tf := range d.fields(f.v, "tiers") {
			if !validID(tf.key) {
				d.errorf(tf.k, "tiers: tier name %q: use letters, digits, '_', '-' and '.'", tf.key)
				continue
			}
			spec := d.limitSpec(tf.v, "tiers."+tf.key, nil)
			spec = spec.over(limitSpec{alg: st.alg})
			// A tier with a bad limit still exists, so that what names it
			// is not reported as naming an unknown tier; its problems are
			// reported here, once.
			ok := d.complete(spec, tf.v, "tiers."+tf.key)
			spec.bad = !ok
			st.tiers[tf.key] = spec
			st.tierNames = append(st.tierNames, tf.key)
			if !ok {
				continue
			}
			if l := d.compile(spec, st, FailOpen, 1, "tiers."+tf.key, 1); l != nil {
				p.Tiers[tf.key] = &Tier{Name: tf.key, Limit: l}
			}
		}
	}
	if f, ok := byKey["default_tier"]; ok {
		if s, ok := d.str(f.v, "default_tier"); ok {
			if _, known := st.tiers[s]; !known {
				d.errorf(f.v, "default_tier: %q is not one of the tiers", s)
			}
			st.defaultTier = st.tierName(s)
		}
	} else if _, ok := st.tiers["free"]; ok {
		st.defaultTier = st.tierName("free")
	} else if len(st.tierNames) > 0 {
		d.errorf(byKey["tiers"].k, "tiers: set default_tier (no tier is named free)")
	}
	p.DefaultTier = st.defaultTier
	p.st = st
	if f, ok := byKey["rules"]; ok {
		d.rules(f.v, st, p)
	}
	if f, ok := byKey["assignments"]; ok {
		d.assignments(f.v, st, p)
	}
	d.shareQuanta(st, p)
	if f, ok := byKey["allow"]; ok {
		d.identities(f.v, "allow", &p.allow)
	}
	if f, ok := byKey["deny"]; ok {
		d.identities(f.v, "deny", &p.deny)
	}
	if f, ok := byKey["envoy"]; ok {
		for _, n := range d.seq(f.v, "envoy") {
			dom := d.envoyDomain(n)
			if dom == nil {
				continue
			}
			if p.envoy == nil {
				p.envoy = map[string]*envoyDomain{}
			}
			if _, dup := p.envoy[dom.name]; dup {
				d.errorf(n, "envoy: duplicate domain %q", dom.name)
				continue
			}
			p.envoy[dom.name] = dom
		}
	}
}

func (d *decoder) defaults(n *yaml.Node, st *settings) {
	for _, f := range d.fields(n, "defaults", "algorithm", "failure_mode", "expected_instances", "cost_multipliers", "priority_multipliers") {
		switch f.key {
		case "algorithm":
			if a, ok := d.algorithm(f.v, "defaults.algorithm"); ok {
				st.alg = a
			}
		case "failure_mode":
			if m, ok := d.failureMode(f.v, "defaults.failure_mode"); ok {
				st.failure = m
			}
		case "expected_instances":
			if v, ok := d.instances(f.v, "defaults.expected_instances"); ok {
				st.instances = v
			}
		case "cost_multipliers":
			if m := d.costMultipliers(f.v, "defaults.cost_multipliers"); m != nil {
				st.costs = m
			}
		case "priority_multipliers":
			for _, pf := range d.fields(f.v, "defaults.priority_multipliers", "high", "low") {
				v, ok := d.float(pf.v, "defaults.priority_multipliers."+pf.key)
				if !ok {
					continue
				}
				if v <= 0 || v > 100 {
					d.errorf(pf.v, "defaults.priority_multipliers.%s: must be above 0 and at most 100, got %v", pf.key, v)
					continue
				}
				if pf.key == "high" {
					st.high = v
				} else {
					st.low = v
				}
			}
		}
	}
}

func (d *decoder) algorithm(n *yaml.Node, what string) (sluice.Algorithm, bool) {
	s, ok := d.str(n, what)
	if !ok {
		return 0, false
	}
	a, err := sluice.ParseAlgorithm(s)
	if err != nil {
		d.errorf(n, "%s: %v", what, err)
		return 0, false
	}
	return a, true
}

func (d *decoder) failureMode(n *yaml.Node, what string) (FailureMode, bool) {
	s, ok := d.str(n, what)
	if !ok {
		return 0, false
	}
	for m := FailOpen; m <= FailLocal; m++ {
		if failureModeNames[m] == s {
			return m, true
		}
	}
	d.errorf(n, "%s: unknown failure mode %q (want fail_open, fail_closed or local)", what, s)
	return 0, false
}

func (d *decoder) instances(n *yaml.Node, what string) (int64, bool) {
	v, ok := d.int64(n, what)
	if ok && (v < 1 || v > 10_000) {
		d.errorf(n, "%s: must be between 1 and 10000, got %d", what, v)
		return 0, false
	}
	return v, ok
}

func (d *decoder) costMultipliers(n *yaml.Node, what string) map[string]int64 {
	fs := d.fields(n, what)
	if fs == nil {
		return nil
	}
	m := make(map[string]int64, len(fs))
	named := make(map[string]string, len(fs)) // operation to its key as written
	for _, f := range fs {
		op := strings.ToLower(f.key)
		if first, dup := named[op]; dup {
			d.errorf(f.k, "%s: %q and %q name one operation (names are case-insensitive)", what, f.key, first)
			continue
		}
		named[op] = f.key
		v, ok := d.int64(f.v, what+"."+f.key)
		if !ok {
			continue
		}
		if v < 0 || v > 1_000_000 {
			d.errorf(f.v, "%s.%s: must be between 0 and 1000000, got %d", what, f.key, v)
			continue
		}
		m[op] = v
	}
	return m
}

// tierName returns the file's own string of the tier named t (t when
// there is none): the layer keeps identities' tiers as these, so that
// comparing two is comparing two pointers, not reading two strings.
func (st *settings) tierName(t string) string {
	for _, n := range st.tierNames {
		if n == t {
			return n
		}
	}
	return t
}
