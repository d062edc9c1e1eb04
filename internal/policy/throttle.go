// Emergency throttles: the cut of the limits at a check's instant, and the
// cut limits, compiled once each and counting on the keys of the limits
// they cut.

package policy

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Throttle returns the percent (0 to 100) by which the layer's throttles
// cut the limits of a check of client at now: the largest of the active
// throttles that apply (global, this region's, the client's); 0 when none
// does or p has no layer. It does not allocate.
func (p *Policy) Throttle(client string, now time.Time) float64 {
	if p.layer == nil {
		return 0
	}
	ts := &p.layer.throttles
	cut := maxActive(ts.all, now, 0)
	if ts.byClient != nil {
		cut = maxActive(ts.byClient[client], now, cut)
	}
	return cut
}

func maxActive(ts []throttle, now time.Time, cut float64) float64 {
	for _, t := range ts {
		if t.percent > cut && (t.expiresAt.IsZero() || now.Before(t.expiresAt)) {
			cut = t.percent
		}
	}
	return cut
}

// Cut returns l with its limit and burst cut by percent (0 to 100; 100
// denies everything): l itself for 0. The cut limit counts at l's quantum
// and has l's tag, so that it counts on l's store keys and a throttle
// neither resets nor forks counts. Each (l, percent) is compiled once and
// kept with the policy; Cut is safe for concurrent use.
func (p *Policy) Cut(l *Limit, percent float64) *Limit {
	if percent <= 0 || l == nil || p.layer == nil || l.src == nil {
		return l
	}
	return p.layer.cuts.get(l, percent)
}

// cutCache holds the cut limits of one policy.
type cutCache struct {
	st *settings
	m  sync.Map // cutKey -> *Limit
}

type cutKey struct {
	l       *Limit
	percent float64
}

func newCutCache(st *settings) *cutCache { return &cutCache{st: st} }

func (c *cutCache) get(l *Limit, percent float64) *Limit {
	k := cutKey{l, min(percent, 100)}
	if v, ok := c.m.Load(k); ok {
		return v.(*Limit)
	}
	v, _ := c.m.LoadOrStore(k, c.compile(l, k.percent))
	return v.(*Limit)
}

// compile compiles l cut by percent at l's quantum; l when it cannot.
func (c *cutCache) compile(l *Limit, percent float64) *Limit {
	spec := l.src.spec
	spec.alg = l.Spec.Algorithm
	if percent >= 100 {
		spec.limit, spec.burst, spec.hasBur = 0, 0, false
		return c.compileSpec(l, spec, true)
	}
	sc := scale(l.Spec, (100-percent)/100)
	spec.limit, spec.burst = sc.Limit, sc.Burst
	return c.compileSpec(l, spec, false)
}

func (c *cutCache) compileSpec(l *Limit, spec limitSpec, denyAll bool) *Limit {
	d := &decoder{file: "throttle"}
	q := l.Params[0].Quantum
	cl := d.compileDeny(spec, c.st, l.src.fm, l.src.instances, l.src.what, q, denyAll)
	if cl == nil || cl.Tag != l.Tag {
		return l
	}
	return cl
}

// warm compiles the cut limits of p's rules for the throttles of every
// check, so that checks do not compile them.
func (c *cutCache) warm(p *Policy, ts throttles) {
	for _, t := range ts.all {
		if t.percent <= 0 {
			continue
		}
		for _, r := range p.Rules {
			for _, l := range r.Limits() {
				p.Cut(l, t.percent)
			}
		}
	}
}

// throttle is a compiled LayerThrottle.
type throttle struct {
	percent   float64
	expiresAt time.Time
}

// throttles are a layer's throttles: those of every check here (global,
// and this region's) and those by client.
type throttles struct {
	all      []throttle
	byClient map[string][]throttle
}

func compileThrottles(l *Layer) (throttles, []*LayerError) {
	var ts throttles
	var errs []*LayerError
	for _, lt := range l.Throttles {
		bad := func(field, msg string) {
			errs = append(errs, &LayerError{Object: "throttle", ID: lt.ID, Field: field, Msg: msg})
		}
		if math.IsNaN(lt.Percent) || lt.Percent < 0 || lt.Percent > 100 {
			bad("percent", fmt.Sprintf("must be between 0 and 100, got %v", lt.Percent))
			continue
		}
		t := throttle{percent: lt.Percent, expiresAt: lt.ExpiresAt}
		switch lt.Scope {
		case "global":
			ts.all = append(ts.all, t)
		case "region":
			if lt.Target == "" {
				bad("target", "a region throttle needs the region")
				continue
			}
			if lt.Target == l.Region {
				ts.all = append(ts.all, t)
			}
		case "client":
			if lt.Target == "" {
				bad("target", "a client throttle needs the client id")
				continue
			}
			if ts.byClient == nil {
				ts.byClient = map[string][]throttle{}
			}
			ts.byClient[lt.Target] = append(ts.byClient[lt.Target], t)
		default:
			bad("scope", fmt.Sprintf("unknown scope %q (want global, region or client)", lt.Scope))
		}
	}
	return ts, errs
}
