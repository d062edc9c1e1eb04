package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
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

var algorithmAbbrev = map[sluice.Algorithm]string{
	sluice.TokenBucket:          "tb",
	sluice.LeakyBucket:          "lb",
	sluice.FixedWindow:          "fw",
	sluice.SlidingWindowLog:     "swl",
	sluice.SlidingWindowCounter: "swc",
	sluice.GCRA:                 "gcra",
}

// limitSpec is a possibly partial limit as written in the file.
type limitSpec struct {
	alg     sluice.Algorithm
	limit   int64
	window  time.Duration
	burst   int64
	hasLim  bool
	hasWin  bool
	hasBur  bool
	node    *yaml.Node
	present bool
	// bad reports a field given with a value already reported as
	// invalid: the limit is not compiled, and the field is not also
	// reported as missing.
	bad bool
}

// over returns s with the fields it lacks taken from base.
func (s limitSpec) over(base limitSpec) limitSpec {
	out := base
	out.present = s.present || base.present
	out.bad = s.bad || base.bad
	if s.node != nil {
		out.node = s.node
	}
	if s.alg != 0 {
		out.alg = s.alg
	}
	if s.hasLim {
		out.limit, out.hasLim = s.limit, true
	}
	if s.hasWin {
		out.window, out.hasWin = s.window, true
	}
	if s.hasBur {
		out.burst, out.hasBur = s.burst, true
	}
	return out
}

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
			st.defaultTier = s
		}
	} else if _, ok := st.tiers["free"]; ok {
		st.defaultTier = "free"
	} else if len(st.tierNames) > 0 {
		d.errorf(byKey["tiers"].k, "tiers: set default_tier (no tier is named free)")
	}
	p.DefaultTier = st.defaultTier
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

// limitSpec decodes the limit fields of mapping n; extra names further
// keys the caller handles (nil: n holds only limit fields).
func (d *decoder) limitSpec(n *yaml.Node, what string, fs []field) limitSpec {
	spec := limitSpec{node: n}
	if fs == nil {
		fs = d.fields(n, what, "algorithm", "limit", "window", "burst")
	}
	for _, f := range fs {
		// A field given is present even when its value is bad: it is
		// reported once, as bad, not also as missing.
		spec.present = true
		ok := false
		switch f.key {
		case "algorithm":
			var a sluice.Algorithm
			if a, ok = d.algorithm(f.v, what+".algorithm"); ok {
				spec.alg = a
			}
		case "limit":
			spec.hasLim = true
			var v int64
			if v, ok = d.int64(f.v, what+".limit"); ok {
				if ok = v > 0 && v <= sluice.MaxLimit; !ok {
					d.errorf(f.v, "%s.limit: must be between 1 and %d, got %d", what, int64(sluice.MaxLimit), v)
				} else {
					spec.limit = v
				}
			}
		case "window":
			spec.hasWin = true
			var v time.Duration
			if v, ok = d.duration(f.v, what+".window"); ok {
				if ok = v <= sluice.MaxWindow && v%time.Microsecond == 0; !ok {
					d.errorf(f.v, "%s.window: must be a whole number of microseconds up to %s, got %s", what, sluice.MaxWindow, v)
				} else {
					spec.window = v
				}
			}
		case "burst":
			spec.hasBur = true
			var v int64
			if v, ok = d.int64(f.v, what+".burst"); ok {
				if ok = v > 0 && v <= sluice.MaxLimit; !ok {
					d.errorf(f.v, "%s.burst: must be between 1 and %d, got %d", what, int64(sluice.MaxLimit), v)
				} else {
					spec.burst = v
				}
			}
		}
		spec.bad = spec.bad || !ok
	}
	return spec
}

// complete reports whether spec has a limit and a window, all of its
// fields valid, reporting those missing.
func (d *decoder) complete(spec limitSpec, n *yaml.Node, what string) bool {
	if !spec.hasLim {
		d.errorf(n, "%s: missing limit", what)
	}
	if !spec.hasWin {
		d.errorf(n, "%s: missing window", what)
	}
	return spec.hasLim && spec.hasWin && !spec.bad
}

// compile compiles spec with its priority variants and local shares. The
// variants count at one quantum, the finest from minQuantum up at which
// all of them can be counted, since they share one state.
func (d *decoder) compile(spec limitSpec, st *settings, fm FailureMode, instances int64, what string, minQuantum int64) *Limit {
	base := sluice.Limit{Algorithm: spec.alg, Limit: spec.limit, Window: spec.window, Burst: spec.burst}
	if base.Algorithm == 0 {
		base.Algorithm = st.alg
	}
	l := &Limit{Spec: base, src: &limitSource{spec: spec, fm: fm, instances: instances, what: what}}
	mult := [numPriorities]float64{PriorityNormal: 1, PriorityHigh: st.high, PriorityLow: st.low}
	var variants [numPriorities]sluice.Limit
	q := minQuantum
	for pr, m := range mult {
		v := scale(base, m)
		if v.Algorithm == sluice.SlidingWindowLog && v.Limit > MaxLogLimit {
			d.errorf(spec.node, "%s: a sliding_window_log keeps one entry per admitted unit: limit %d (at %s priority) is above %d; use sliding_window_counter", what, v.Limit, Priority(pr), MaxLogLimit)
			return nil
		}
		p, err := algorithm.CompileAt(v, q)
		if err != nil {
			d.errorf(spec.node, "%s: %v", what, err)
			return nil
		}
		variants[pr], q = v, max(q, p.Quantum)
	}
	for pr, v := range variants {
		p, err := algorithm.CompileAt(v, q)
		if err != nil {
			d.errorf(spec.node, "%s: %v", what, err)
			return nil
		}
		l.Params[pr] = p
		if fm == FailLocal {
			// The local shares, which share a state in process, count
			// at the same quantum: a share is smaller than its limit.
			lv := v
			lv.Limit = ceilDiv(v.Limit, instances)
			if v.Burst > 0 {
				lv.Burst = ceilDiv(v.Burst, instances)
			}
			lp, err := algorithm.CompileAt(lv, q)
			if err != nil {
				d.errorf(spec.node, "%s: local share: %v", what, err)
				return nil
			}
			l.Local[pr] = lp
		}
	}
	// The variants count on one state: it expires at the slowest refill.
	algorithm.ShareState(l.Params[:])
	if fm == FailLocal {
		algorithm.ShareState(l.Local[:])
	}
	l.Tag = layoutTag(base.Algorithm, &l.Params[0])
	return l
}

// limitSource is what a Limit was compiled from, to compile it again at a
// coarser quantum.
type limitSource struct {
	spec      limitSpec
	fm        FailureMode
	instances int64
	what      string
}

// shareQuanta compiles again, at one quantum, the limits of each rule
// that count on one state: its own, its tiers' and the identities'
// overrides of one algorithm and window. Compile picks the finest quantum
// that can count a limit exactly, which depends on the limit too (10 µs
// rather than 1 µs for a daily limit above 26,062), and the quantum is
// part of a key's tag: without this, a tier change or an override across
// such a bound would start its count afresh.
func (d *decoder) shareQuanta(st *settings, p *Policy) {
	type layout struct {
		alg    sluice.Algorithm
		window time.Duration
	}
	type use struct {
		l   *Limit
		set func(*Limit)
	}
	for _, r := range p.Rules {
		var uses []use
		if r.Base != nil {
			uses = append(uses, use{r.Base, func(l *Limit) { r.Base = l }})
		}
		for t, l := range r.byTier {
			uses = append(uses, use{l, func(l *Limit) { r.byTier[t] = l }})
		}
		for _, byValue := range p.assignments {
			for _, list := range byValue {
				for _, a := range list {
					if l := a.Limits[r.ID]; l != nil {
						uses = append(uses, use{l, func(l *Limit) { a.Limits[r.ID] = l }})
					}
				}
			}
		}
		coarsest := map[layout]int64{}
		for _, u := range uses {
			k := layout{u.l.Spec.Algorithm, u.l.Spec.Window}
			coarsest[k] = max(coarsest[k], u.l.Params[0].Quantum)
		}
		for _, u := range uses {
			q := coarsest[layout{u.l.Spec.Algorithm, u.l.Spec.Window}]
			if u.l.Params[0].Quantum < q {
				src := u.l.src
				if l := d.compile(src.spec, st, src.fm, src.instances, src.what, q); l != nil {
					u.set(l)
				}
			}
		}
	}
}

// layoutTag returns the tag of store keys for state of algorithm alg
// counted as p says (see key.go).
func layoutTag(alg sluice.Algorithm, p *algorithm.Params) string {
	tag := algorithmAbbrev[alg] + "." + p.WindowDuration().String()
	if p.Quantum != 1 {
		tag += fmt.Sprintf(".q%d", p.Quantum)
	}
	return tag
}

// scale multiplies the limit and burst of l by m, rounding down, at least 1.
func scale(l sluice.Limit, m float64) sluice.Limit {
	if m == 1 {
		return l
	}
	f := func(v int64) int64 {
		if v == 0 {
			return 0
		}
		x := math.Floor(float64(v) * m)
		if x < 1 {
			return 1
		}
		if x > sluice.MaxLimit {
			return sluice.MaxLimit
		}
		return int64(x)
	}
	l.Limit, l.Burst = f(l.Limit), f(l.Burst)
	return l
}

func ceilDiv(a, b int64) int64 {
	if b <= 1 {
		return a
	}
	return (a + b - 1) / b
}

// validID reports whether s is usable as a rule id or tier name.
func validID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

var ruleKeys = []string{"id", "name", "match", "dimension", "algorithm", "limit", "window", "burst",
	"tiered", "tiers", "cost_multipliers", "shadow", "failure_mode", "expected_instances"}

func (d *decoder) rules(n *yaml.Node, st *settings, p *Policy) {
	items := d.seq(n, "rules")
	if len(items) > MaxRules {
		d.errorf(n, "rules: %d rules is more than the maximum %d", len(items), MaxRules)
		return
	}
	firstLine := map[string]int{}
	for i, item := range items {
		what := fmt.Sprintf("rules[%d]", i)
		fs := d.fields(item, what, ruleKeys...)
		if fs == nil {
			continue
		}
		r := &Rule{Index: len(p.Rules), FailureMode: st.failure, ExpectedInstances: st.instances, CostMultipliers: st.costs}
		limitFields := []field{}
		var tiersNode *yaml.Node
		dimSet := false
		ok := true
		for _, f := range fs {
			switch f.key {
			case "id":
				if s, good := d.str(f.v, what+".id"); good {
					if !validID(s) {
						d.errorf(f.v, "%s.id: %q: use 1 to 128 letters, digits, '_', '-' and '.'", what, s)
						ok = false
					} else if line, dup := firstLine[s]; dup {
						d.errorf(f.v, "%s.id: duplicate rule id %q (first at line %d)", what, s, line)
						ok = false
					} else {
						firstLine[s] = f.v.Line
						r.ID = s
						what = fmt.Sprintf("rule %q", s)
					}
				}
			case "name":
				r.Name, _ = d.str(f.v, what+".name")
			case "match":
				d.match(f.v, what+".match", r)
			case "dimension":
				dimSet = true
				if s, good := d.str(f.v, what+".dimension"); good {
					dims, err := parseDimensions(s)
					if err != "" {
						d.errorf(f.v, "%s.dimension: %s", what, err)
						ok = false
					}
					r.Dimension, r.DimensionName = dims, s
				}
			case "algorithm", "limit", "window", "burst":
				limitFields = append(limitFields, f)
			case "tiered":
				r.Tiered, _ = d.bool(f.v, what+".tiered")
			case "tiers":
				tiersNode = f.v
			case "cost_multipliers":
				if m := d.costMultipliers(f.v, what+".cost_multipliers"); m != nil {
					r.CostMultipliers = m
				}
			case "shadow":
				r.Shadow, _ = d.bool(f.v, what+".shadow")
			case "failure_mode":
				if m, good := d.failureMode(f.v, what+".failure_mode"); good {
					r.FailureMode = m
				}
			case "expected_instances":
				if v, good := d.instances(f.v, what+".expected_instances"); good {
					r.ExpectedInstances = v
				}
			}
		}
		if r.ID == "" {
			if ok {
				d.errorf(item, "%s: missing id", what)
			}
			continue
		}
		if !dimSet {
			r.Dimension, r.DimensionName = []Dimension{DimClient}, "client"
		}
		r.keyPrefix = "rl:" + r.ID + ":"
		base := d.limitSpec(item, what, limitFields)
		base.node = item
		if base.present && r.Tiered {
			d.errorf(item, "%s: a tiered rule takes its limits from the tiers; remove algorithm, limit, window and burst, or use tiers: to set this rule's limit per tier", what)
		} else if base.present {
			spec := base.over(limitSpec{alg: st.alg})
			if d.complete(spec, item, what) {
				r.Base = d.compile(spec, st, r.FailureMode, r.ExpectedInstances, what, 1)
			}
		} else if !r.Tiered {
			d.errorf(item, "%s: set limit and window, or tiered: true to take the limit from the identity's tier", what)
		}
		if r.Tiered {
			if len(st.tierNames) == 0 {
				d.errorf(item, "%s: tiered: true needs tiers at the top level", what)
			}
		}
		perTier := map[string]limitSpec{}
		if tiersNode != nil {
			for _, tf := range d.fields(tiersNode, what+".tiers") {
				if _, known := st.tiers[tf.key]; !known {
					d.errorf(tf.k, "%s.tiers: unknown tier %q", what, tf.key)
					continue
				}
				perTier[tf.key] = d.limitSpec(tf.v, what+".tiers."+tf.key, nil)
			}
		}
		if r.Tiered || len(perTier) > 0 {
			r.byTier = map[string]*Limit{}
			for _, t := range st.tierNames {
				s, has := perTier[t]
				var parent limitSpec
				if r.Tiered {
					parent = st.tiers[t]
				} else {
					parent = base.over(limitSpec{alg: st.alg})
				}
				if !has && !r.Tiered || parent.bad {
					// A bad parent (a tier's limit, the rule's own) is
					// reported where it is written.
					continue
				}
				spec := s.over(parent)
				if !has {
					spec.node = item
				}
				if d.complete(spec, spec.node, what+".tiers."+t) {
					if l := d.compile(spec, st, r.FailureMode, r.ExpectedInstances, what+".tiers."+t, 1); l != nil {
						r.byTier[t] = l
					}
				}
			}
		}
		p.Rules = append(p.Rules, r)
	}
}

func parseDimensions(s string) ([]Dimension, string) {
	parts := strings.Split(s, "+")
	dims := make([]Dimension, 0, len(parts))
	for _, part := range parts {
		dm, ok := parseDimension(strings.TrimSpace(part))
		if !ok {
			return nil, fmt.Sprintf("unknown dimension %q (want client, user, ip, api_key, endpoint, method, operation or global, or a composite such as user+endpoint)", part)
		}
		for _, x := range dims {
			if x == dm {
				return nil, fmt.Sprintf("dimension %q appears twice", part)
			}
		}
		dims = append(dims, dm)
	}
	if len(dims) > 1 {
		for _, x := range dims {
			if x == DimGlobal {
				return nil, "global cannot be part of a composite dimension"
			}
		}
	}
	return dims, ""
}

func (d *decoder) match(n *yaml.Node, what string, r *Rule) {
	for _, f := range d.fields(n, what, "resource", "method", "operation") {
		switch f.key {
		case "resource":
			for _, s := range d.strings(f.v, what+".resource") {
				if err := checkPattern(s); err != "" {
					d.errorf(f.v, "%s.resource: %q: %s", what, s, err)
					continue
				}
				r.Resources = append(r.Resources, s)
			}
		case "method":
			for _, s := range d.strings(f.v, what+".method") {
				r.Methods = append(r.Methods, strings.ToUpper(s))
			}
		case "operation":
			for _, s := range d.strings(f.v, what+".operation") {
				r.Operations = append(r.Operations, strings.ToLower(s))
			}
		}
	}
}

// checkPattern validates a resource pattern; "" when it is valid.
func checkPattern(s string) string {
	if len(s) > 1024 {
		return "longer than 1024 bytes"
	}
	if isGlob(s) {
		if _, err := path.Match(s, ""); err != nil {
			return "bad glob pattern"
		}
	}
	return ""
}

var assignmentKeys = []string{"client", "user", "api_key", "tier", "limits", "expires_at"}

func (d *decoder) assignments(n *yaml.Node, st *settings, p *Policy) {
	rules := map[string]*Rule{}
	for _, r := range p.Rules {
		rules[r.ID] = r
	}
	for i, item := range d.seq(n, "assignments") {
		what := fmt.Sprintf("assignments[%d]", i)
		fs := d.fields(item, what, assignmentKeys...)
		if fs == nil {
			continue
		}
		a := &Assignment{}
		var limitsNode *yaml.Node
		for _, f := range fs {
			switch f.key {
			case "client", "user", "api_key":
				if a.Kind != 0 {
					d.errorf(f.k, "%s: give one of client, user or api_key", what)
					continue
				}
				if s, ok := d.str(f.v, what+"."+f.key); ok && s != "" {
					dm, _ := parseDimension(f.key)
					a.Kind, a.Value = dm, s
				}
			case "tier":
				if s, ok := d.str(f.v, what+".tier"); ok {
					if _, known := st.tiers[s]; !known {
						d.errorf(f.v, "%s.tier: unknown tier %q", what, s)
					}
					a.Tier = s
				}
			case "limits":
				limitsNode = f.v
			case "expires_at":
				if s, ok := d.str(f.v, what+".expires_at"); ok {
					t, err := time.Parse(time.RFC3339, s)
					if err != nil {
						d.errorf(f.v, "%s.expires_at: want an RFC 3339 time such as 2030-01-02T15:04:05Z, got %q", what, s)
					}
					a.ExpiresAt = t
				}
			}
		}
		if a.Kind == 0 {
			d.errorf(item, "%s: missing client, user or api_key", what)
			continue
		}
		if limitsNode != nil {
			a.Limits = map[string]*Limit{}
			for _, lf := range d.fields(limitsNode, what+".limits") {
				r, ok := rules[lf.key]
				if !ok {
					d.errorf(lf.k, "%s.limits: unknown rule id %q", what, lf.key)
					continue
				}
				s := d.limitSpec(lf.v, what+".limits."+lf.key, nil)
				// Unset fields come from the limit the rule would apply to
				// this identity's tier.
				tier := a.Tier
				if tier == "" {
					tier = st.defaultTier
				}
				parent := limitSpec{alg: st.alg}
				if l := r.LimitFor(tier, nil); l != nil {
					b := l.Spec
					parent = limitSpec{alg: b.Algorithm, limit: b.Limit, window: b.Window, burst: b.Burst, hasLim: true, hasWin: true, hasBur: b.Burst > 0}
				} else {
					// The rule's limit for the tier has a problem,
					// reported at the rule or the tier: what the
					// override leaves out is not also reported as
					// missing.
					parent.bad = true
				}
				spec := s.over(parent)
				if parent.bad && !(s.hasLim && s.hasWin) {
					continue
				}
				if d.complete(spec, lf.v, what+".limits."+lf.key) {
					if l := d.compile(spec, st, r.FailureMode, r.ExpectedInstances, what+".limits."+lf.key, 1); l != nil {
						a.Limits[r.ID] = l
					}
				}
			}
		}
		if p.assignments[a.Kind] == nil {
			p.assignments[a.Kind] = map[string][]*Assignment{}
		}
		p.assignments[a.Kind][a.Value] = append(p.assignments[a.Kind][a.Value], a)
	}
}

func (d *decoder) identities(n *yaml.Node, what string, set *identitySet) {
	for i, item := range d.seq(n, what) {
		w := fmt.Sprintf("%s[%d]", what, i)
		fs := d.fields(item, w, "client", "user", "api_key", "ip")
		if len(fs) != 1 {
			if fs != nil {
				d.errorf(item, "%s: give exactly one of client, user, api_key or ip", w)
			}
			continue
		}
		f := fs[0]
		s, ok := d.str(f.v, w+"."+f.key)
		if !ok || s == "" {
			if ok {
				d.errorf(f.v, "%s.%s: must not be empty", w, f.key)
			}
			continue
		}
		if f.key == "ip" {
			if strings.Contains(s, "/") {
				pfx, err := netip.ParsePrefix(s)
				if err != nil {
					d.errorf(f.v, "%s.ip: %q is not an address or CIDR prefix", w, s)
					continue
				}
				if pfx.Addr().Is4In6() {
					// Checks' addresses are unmapped before matching, so a
					// mapped prefix is kept as the IPv4 prefix it covers.
					if pfx.Bits() < 96 {
						d.errorf(f.v, "%s.ip: %q is an IPv4-mapped prefix shorter than /96 (write the IPv4 prefix, or an IPv6 prefix without ::ffff:)", w, s)
						continue
					}
					pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
				}
				set.prefixes = append(set.prefixes, pfx.Masked())
				continue
			}
			addr, err := netip.ParseAddr(s)
			if err != nil {
				d.errorf(f.v, "%s.ip: %q is not an address or CIDR prefix", w, s)
				continue
			}
			set.prefixes = append(set.prefixes, netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()))
			continue
		}
		dm, _ := parseDimension(f.key)
		set.add(dm, s)
	}
}
