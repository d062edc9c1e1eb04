// Check and CheckAll: batches as script calls, replies as decisions.

package redis

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Script modes of check.lua.
const (
	modeEach  = "0"
	modeAll   = "1"
	modeOnce  = "2"
	modeProbe = "3"
)

// group is the part of a batch sent as one script call: requests whose keys
// share a slot (or all requests, on a standalone server).
type group struct {
	script *script
	idx    []int // indexes into the batch
	keys   []string
	args   []string
	work   int // of split's calls in modeEach (see callWork)
	// uniform is the parameter set of every check of a checkeach.lua
	// call that uses one at Redis' clock and one cost, nil otherwise: its
	// reply is read with it (see eachReply).
	uniform *algorithm.Params
}

// Check decides each request on its own, in order, and writes its decision
// to out[i]; a key that appears twice sees the effect of its first request.
// When a request is invalid (a negative cost wraps sluice.ErrInvalidCost,
// a bad Params or too long a log wraps sluice.ErrInvalidLimit) Check decides
// nothing and returns the error. out must be at least as long as reqs.
func (s *Store) Check(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if err := s.begin(reqs, out); err != nil || len(reqs) == 0 {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	failed, err := s.checkEach(ctx, reqs, out)
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) == len(reqs):
		return err
	}
	return &store.PartialError{Failed: failed, Err: err}
}

// CheckAll decides reqs as one unit: when every request is admitted, all
// consume their cost; when any is denied, none consumes anything and every
// out[i].Allowed is false. A denied request reports its own decision; a
// request that alone would have been admitted reports the state of its key
// as it stands (Remaining before its cost) with ReasonLimited and a zero
// RetryAfter. On one node (a standalone server, or keys sharing a slot) this
// is one script call, atomic; across slots of a cluster it takes two
// phases (see the package documentation). Errors are those of Check.
func (s *Store) CheckAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if err := s.begin(reqs, out); err != nil || len(reqs) == 0 {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.checkAll(ctx, reqs, out)
}

// checkAll is CheckAll after validation, within the call's deadline.
func (s *Store) checkAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if g := s.allEach(reqs); g != nil {
		// The common case (the rules of one identity): the lean script.
		res, err := s.exec(ctx, []*group{g})
		if err != nil {
			return err
		}
		s.fill(reqs, out, g.idx, res[0])
		return nil
	}
	groups := s.split(reqs, modeAll, "")
	if len(groups) <= 1 {
		res, err := s.exec(ctx, groups)
		if err != nil {
			return err
		}
		for g, r := range res {
			s.fill(reqs, out, groups[g].idx, r)
		}
		return nil
	}
	// Across slots: probe every part, then commit when all are admitted.
	for _, g := range groups {
		g.args[0] = modeProbe
	}
	res, err := s.exec(ctx, groups)
	if err != nil {
		return err
	}
	all := true
	for g, r := range res {
		s.fill(reqs, out, groups[g].idx, r)
	}
	for i := range reqs {
		all = all && out[i].Allowed
	}
	if all {
		for _, g := range groups {
			g.args[0] = modeAll
		}
		if res, err = s.exec(ctx, groups); err != nil {
			return err
		}
		for g, r := range res {
			s.fill(reqs, out, groups[g].idx, r)
		}
		for i := range reqs {
			all = all && out[i].Allowed
		}
		if all {
			return nil
		}
	}
	for i := range out[:len(reqs)] {
		if out[i].Allowed {
			out[i].Allowed, out[i].Reason, out[i].RetryAfter = false, sluice.ReasonLimited, 0
		}
	}
	return nil
}

// fill converts a script reply for the requests idx into decisions.
func (s *Store) fill(reqs []store.Request, out []sluice.Decision, idx []int, vals []int64) {
	for j, i := range idx {
		out[i] = decision(reqs[i].Params, vals[2+5*j:7+5*j])
	}
}

// decision returns the decision of a request with params p from the five
// values a script answers for it: allowed (0/1), reason, remaining, reset
// after and retry after (in quanta).
func decision(p *algorithm.Params, v []int64) sluice.Decision {
	return sluice.Decision{
		Allowed:    v[0] == 1,
		Reason:     sluice.Reason(v[1]),
		Limit:      p.Limit,
		Remaining:  v[2],
		ResetAfter: p.Duration(v[3]),
		RetryAfter: p.Duration(v[4]),
	}
}
