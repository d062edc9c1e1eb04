// Global limits: a rule's global_limit is shared by every region, each of
// which counts its own admissions in its own store and learns the others'
// from a sync in the background (internal/globalsync). No check waits on
// another region: a check of a global limit is one more request in the
// check's one store call, a fixed window whose limit is what the other
// regions have not taken, as this region last heard, less a reserve for
// what they may have taken since.

package engine

import (
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
)

// GlobalView is the region's view of the other regions' consumption of
// global limits, kept current in the background (internal/globalsync).
// Both methods are on the check path: they must be cheap and never block.
// A window is named by its key, its start (Unix milliseconds, a multiple
// of its length) and its length.
type GlobalView interface {
	// Allowance returns the most this region's count in the window may
	// reach now, for a global limit of limit: the limit less the other
	// regions' latest known counts and a reserve for what they may have
	// admitted since (see internal/globalsync).
	Allowance(key string, start int64, length time.Duration, limit int64) int64
	// Observe reports this region's count in the window, as its store
	// returned it; counts only grow within a window.
	Observe(key string, start int64, length time.Duration, count int64)
}

// planGlobal appends to s the item of r's global limit for the check, when
// r has one, beside it, the item of r's own limit (whose throttle cuts the
// global limit too), or the template of the check's item when r has no
// other limit (see planGlobalOnly).
func (e *Engine) planGlobal(s *scratch, r *policy.Rule, q *policy.Request, it *item, at time.Time) {
	if r.Global == nil {
		return
	}
	keys, ok := r.AppendGlobalKey(s.keys, q)
	if !ok {
		s.keys = keys[:len(s.keys)]
		return
	}
	s.keys = keys
	g := globalItem(it, r.Global, r.GlobalLocal, at)
	s.items = append(s.items, g)
	s.ends = append(s.ends, len(s.keys))
	s.globals++
}

// planGlobalOnly appends to s the one item of r, a rule whose only limit
// is its global limit, for the check c (number check of its batch): the
// global limit alone decides it, on one key, with a throttle's cut of
// percent cut.
func (e *Engine) planGlobalOnly(s *scratch, r *policy.Rule, q *policy.Request, c *Check, check int, prefix string, cut float64, at time.Time) error {
	cost, err := ruleCost(r, q, c, prefix)
	if err != nil {
		return err
	}
	it := item{check: check, rule: r, mode: r.FailureMode, cost: cost, throttle: cut}
	e.planGlobal(s, r, q, &it, at)
	return nil
}

// globalItem returns the item of the global limit base beside it, the item
// of its limit (or the template of the check's one item, when the global
// limit is alone), at the instant at: the same check, cost and throttle.
// local is the share of base an instance admits on its own in the local
// failure mode, for a global limit alone; nil when another limit's local
// share bounds the check (the global item then fails open).
func globalItem(it *item, base, local *algorithm.Params, at time.Time) item {
	g := *it
	g.gbase, g.at, g.tier, g.local = base, at, "", nil
	g.glimit = base.Limit
	if it.throttle > 0 {
		g.glimit = int64(float64(g.glimit) * (1 - it.throttle/100))
	}
	if g.mode == policy.FailLocal {
		if local != nil {
			// The global limit's share of this instance bounds the check
			// while the store cannot answer.
			g.local = local
		} else {
			// The limit's own local share bounds the check while the
			// store cannot answer.
			g.mode = policy.FailOpen
		}
	}
	return g
}

// resolveGlobal sets the params of the global items of s, once their keys
// are final: the global limit less what the other regions took.
func (e *Engine) resolveGlobal(s *scratch) {
	n := s.globals
	if n == 0 {
		return
	}
	if cap(s.gparams) < n {
		s.gparams = make([]algorithm.Params, n)
	}
	s.gparams = s.gparams[:n]
	j := 0
	for i := range s.items {
		it := &s.items[i]
		if it.gbase == nil {
			continue
		}
		p := &s.gparams[j]
		j++
		*p = *it.gbase
		p.Limit = it.glimit
		if e.global != nil {
			start, length := globalWindow(p, it.at)
			p.Limit = min(max(e.global.Allowance(it.key, start, length, it.glimit), 0), it.glimit)
		}
		// The capacity stays the global limit: a cost within it is
		// refused until the window ends, not as one that never fits.
		p.Burst = it.glimit
		it.params = p
	}
}

// observeGlobal tells the view this region's counts, from the store's
// decisions of the global items of s.
func (e *Engine) observeGlobal(s *scratch) {
	if e.global == nil || s.globals == 0 {
		return
	}
	for i := range s.items {
		it := &s.items[i]
		if it.gbase == nil || it.source != SourceStore {
			continue
		}
		// Remaining is the limit less the count, never negative: a
		// denial with none remaining says only that the count reached
		// the limit, which was told when it did.
		if d := &it.dec; d.Allowed || d.Remaining > 0 {
			start, length := globalWindow(it.params, it.at)
			e.global.Observe(it.key, start, length, it.params.Limit-d.Remaining)
		}
	}
}

// globalWindow returns the start (Unix milliseconds) and the length of the
// fixed window of p that holds at.
func globalWindow(p *algorithm.Params, at time.Time) (start int64, length time.Duration) {
	length = time.Duration(p.Window*p.Quantum) * time.Microsecond
	ms := length.Milliseconds()
	t := at.UnixMilli()
	if ms <= 0 {
		return t, length
	}
	return t - (t%ms+ms)%ms, length
}

// globalResult completes rr, the result of a global item: its limit is
// the global limit, and its remaining what every region together may still
// admit, as this region knows it.
func globalResult(rr *RuleResult, it *item) {
	rr.Global = true
	switch it.source {
	case SourceStore, SourceIdempotent:
		rr.Limit = it.glimit
	case SourceLocal:
		// This instance's share of a rule with only a global limit
		// decided, while the store could not: its limit and remaining,
		// as a regional limit's local share reports.
	default:
		rr.Limit, rr.Remaining = it.glimit, it.glimit
	}
}
