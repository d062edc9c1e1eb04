// Limit compilation: a limit as written (limitSpec), completed from its
// defaults and compiled into the parameters of each priority and the local
// shares, at a quantum shared by the limits that count on one state.

package policy

import (
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyspace"
)

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
	if d.shared == nil {
		return d.compileDeny(spec, st, fm, instances, what, minQuantum, false)
	}
	k := sharedLimit{spec: spec, fm: fm, instances: instances, minQuantum: minQuantum}
	k.spec.node = nil
	if l := d.shared[k]; l != nil {
		return l
	}
	l := d.compileDeny(spec, st, fm, instances, what, minQuantum, false)
	if l != nil {
		d.shared[k] = l
	}
	return l
}

// sharedLimit is what a limit is compiled from, with the settings of the
// decoder's file, but for its place in the file: limits compiled from
// equal ones are equal, and, being immutable, may be one. The layer's
// rules share them, since thousands of its rules have few distinct limits;
// a shared limit's source names the place of the first of them, which
// only messages of compiling it again (for a throttle) would show.
type sharedLimit struct {
	spec       limitSpec // without its node
	fm         FailureMode
	instances  int64
	minQuantum int64
}

// compileDeny is compile, of a limit that denies everything when denyAll
// is set (spec's limit and burst then zero).
func (d *decoder) compileDeny(spec limitSpec, st *settings, fm FailureMode, instances int64, what string, minQuantum int64, denyAll bool) *Limit {
	base := sluice.Limit{Algorithm: spec.alg, Limit: spec.limit, Window: spec.window, Burst: spec.burst, DenyAll: denyAll}
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
	// The overrides by rule, gathered in one pass over the assignments.
	overrides := map[string][]use{}
	for _, byValue := range p.assignments {
		for _, list := range byValue {
			for _, a := range list {
				for id, l := range a.Limits {
					overrides[id] = append(overrides[id], use{l, func(l *Limit) { a.Limits[id] = l }})
				}
			}
		}
	}
	for _, r := range p.Rules {
		var uses []use
		if r.Base != nil {
			uses = append(uses, use{r.Base, func(l *Limit) { r.Base = l }})
		}
		for t, l := range r.byTier {
			uses = append(uses, use{l, func(l *Limit) { r.byTier[t] = l }})
		}
		uses = append(uses, overrides[r.ID]...)
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

// layoutTag returns the layout tag of store keys for state of algorithm
// alg counted as p says.
func layoutTag(alg sluice.Algorithm, p *algorithm.Params) string {
	return keyspace.LayoutTag(alg, p.WindowDuration().String(), p.Quantum)
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
