// The second step of a check, decide: the planned items go to the store in
// one call (the shadow ones in a second), and when the store cannot answer
// each rule's failure mode decides.

package engine

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/share"
	"github.com/sluicehq/sluice/store"
)

// run decides the items of s: the enforcing ones in one all-or-nothing
// Store.Do, then the
// shadow ones on their own. It reports whether every enforcing item
// allowed. now is passed to the store (zero: the store's clock).
func (e *Engine) run(ctx context.Context, s *scratch, now time.Time, atomicAll bool) bool {
	s.idx = s.idx[:0]
	s.reqs = s.reqs[:0]
	for i := range s.items {
		it := &s.items[i]
		if !it.shadow {
			at := now
			if it.gbase != nil {
				// Also keeps the guard from answering it in process: its
				// limit changes from check to check.
				at = it.at
			}
			s.idx = append(s.idx, i)
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: it.cost, Now: at})
		}
	}
	if s.globals > 0 {
		defer e.observeGlobal(s)
	}
	allowed := true
	if len(s.reqs) == 0 && s.idemKey != "" && e.claimShadow(ctx, s, now) {
		// A repeat charges nothing, shadow rules included.
		s.replayed = true
		e.runShadow(ctx, s, now, false)
		return true
	}
	if len(s.reqs) > 0 {
		s.out = grow(s.out, len(s.reqs))
		var err error
		replayed := false
		s.src = growSource(s.src, len(s.reqs))
		if e.shared && s.idemKey != "" {
			replayed, err = e.checkOnce(ctx, s)
			for j := range s.src {
				s.src[j] = SourceStore
			}
		} else {
			err = e.call(ctx, &s.call, atomicAll, s.reqs, s.out, s.src)
		}
		if err == nil && replayed {
			s.replayed = true
			for j, i := range s.idx {
				it := &s.items[i]
				it.dec, it.source = s.out[j], SourceIdempotent
				if !it.dec.Allowed {
					allowed = false
				}
			}
			if !allowed {
				for _, i := range s.idx {
					if it := &s.items[i]; !blocking(it.dec) {
						it.dec.Allowed, it.dec.Reason = true, sluice.ReasonAllowed
					}
				}
			}
			// A repeat charges nothing, shadow rules included.
			e.runShadow(ctx, s, now, false)
			return allowed
		}
		if err != nil {
			allowed = e.fallback(ctx, s, now, FallbackOf(err), e.maybeClosed && errors.Is(err, store.ErrMaybeCounted))
		} else {
			for j, i := range s.idx {
				it := &s.items[i]
				it.dec, it.source = s.out[j], s.src[j]
				if !it.dec.Allowed {
					allowed = false
				}
			}
			if allowed {
				for _, i := range s.idx {
					s.items[i].charged = s.items[i].cost
				}
			} else if atomicAll {
				// CheckAll consumed nothing: report what each rule
				// would have decided on its own.
				for _, i := range s.idx {
					it := &s.items[i]
					if !blocking(it.dec) {
						it.dec.Allowed = true
						it.dec.Reason = sluice.ReasonAllowed
					}
				}
			} else {
				for _, i := range s.idx {
					if s.items[i].dec.Allowed {
						s.items[i].charged = s.items[i].cost
					}
				}
			}
		}
	}
	e.runShadow(ctx, s, now, allowed)
	return allowed
}

// fitsAtomic reports whether the enforcing items of s may go to the store
// in one all-or-nothing call, and returns their work: the store work
// (store.Work) of the requests call would send, repeated keys merged, is
// at most the store's bound (Info().MaxAtomicWork), or they are one
// request, or the merged requests of one key. A larger call would hold a
// Redis server, which serves no other client meanwhile, for longer than a
// millisecond: a batch of 1,000 checks of distinct sliding window logs held
// it for about 100ms. now is as for run.
func (e *Engine) fitsAtomic(s *scratch, now time.Time) (work int, ok bool) {
	if e.maxAtomic <= 0 {
		return 0, true
	}
	n := 0
	for i := range s.items {
		if it := &s.items[i]; !it.shadow {
			n++
			work += store.Work(&store.Request{Params: it.params, Cost: it.cost})
		}
	}
	if work <= e.maxAtomic || n <= 1 {
		return work, true // the common case: no request to build
	}
	// Merging sends at most as much work, often far less.
	s.reqs = s.reqs[:0]
	for i := range s.items {
		if it := &s.items[i]; !it.shadow {
			at := now
			if it.gbase != nil {
				at = it.at
			}
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: it.cost, Now: at})
		}
	}
	mp := planMerge(&s.call.plan, s.reqs)
	if mp == nil {
		return work, false
	}
	s.call.merged = mp // for run's call of the same requests
	work = storeWork(mp.reqs)
	if len(mp.groups) == 1 && mp.groups[0].sent == len(mp.reqs) {
		return work, true // one key, merged: at most three requests
	}
	return work, work <= e.maxAtomic || len(mp.reqs) <= 1
}

// storeWork returns the store work of reqs (see store.Work).
func storeWork(reqs []store.Request) int {
	w := 0
	for i := range reqs {
		w += store.Work(&reqs[i])
	}
	return w
}

// claimShadow claims the idempotency key of a check with no enforcing
// item in a store that keeps the records, by recording a read of its
// shadow items, and reports whether the key was already claimed: the check
// is then a repeat and charges nothing. It reports false when the store
// does not keep the records or cannot answer (the check is decided anew).
func (e *Engine) claimShadow(ctx context.Context, s *scratch, now time.Time) bool {
	if !e.shared {
		return false
	}
	for i := range s.items {
		if it := &s.items[i]; it.shadow {
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Now: now})
		}
	}
	if len(s.reqs) == 0 {
		return false
	}
	s.out = grow(s.out, len(s.reqs))
	replayed, err := e.checkOnce(ctx, s)
	s.reqs = s.reqs[:0]
	return err == nil && replayed
}

// runShadow decides the shadow items: charged when allowed, read otherwise.
func (e *Engine) runShadow(ctx context.Context, s *scratch, now time.Time, allowed bool) {
	s.idx = s.idx[:0]
	s.reqs = s.reqs[:0]
	for i := range s.items {
		it := &s.items[i]
		if it.shadow {
			cost := it.cost
			if !allowed {
				cost = 0
			}
			s.idx = append(s.idx, i)
			s.reqs = append(s.reqs, store.Request{Key: it.key, Params: it.params, Cost: cost, Now: now})
		}
	}
	if len(s.reqs) == 0 {
		return
	}
	s.out = grow(s.out, len(s.reqs))
	s.src = growSource(s.src, len(s.reqs))
	if err := e.call(ctx, &s.call, false, s.reqs, s.out, s.src); err != nil {
		// A shadow rule never denies: it reports that it could not tell.
		why := FallbackOf(err)
		for _, i := range s.idx {
			it := &s.items[i]
			it.dec = sluice.Decision{Allowed: true, Limit: it.params.Limit, Remaining: it.params.Limit}
			it.source, it.fallback = SourceFailOpen, why
		}
		return
	}
	for j, i := range s.idx {
		it := &s.items[i]
		it.dec, it.source = s.out[j], s.src[j]
		if it.dec.Allowed {
			it.charged = s.reqs[j].Cost
		}
	}
}

// blocking reports whether d is a denial of its own, rather than a
// request CheckAll refused because another request of the batch was
// denied (reported as limited with no retry-after).
func blocking(d sluice.Decision) bool {
	return !d.Allowed && (d.Reason != sluice.ReasonLimited || d.RetryAfter > 0)
}

func grow(out []sluice.Decision, n int) []sluice.Decision {
	if cap(out) < n {
		return make([]sluice.Decision, n)
	}
	return out[:n]
}

func growSource(src []Source, n int) []Source {
	if cap(src) < n {
		return make([]Source, n)
	}
	return src[:n]
}

// storeCall holds the buffers of the engine's calls of Store.Do, kept in
// the per-check scratch so that a check allocates none.
type storeCall struct {
	b    store.Batch
	once store.Once
	src  []store.Source
	// turn, when set, is the turn of the bulk request making the call
	// (see share.Gate): it pauses while the call waits on the store, and
	// only then, so that the work done in process around the store (the
	// merge of repeated keys, a store decorator answering in process)
	// takes the request's share like the rest of its work.
	turn *share.Turn
	// merged is the merge plan fitsAtomic made of the next all-or-nothing
	// call's requests, which call then need not make again.
	merged *mergePlan
	// plan is the memory of the merge plans of the calls.
	plan mergePlan
}

// call is the one place the engine calls the store to decide, on the
// buffers of c: all decides reqs as one unit (Batch.All), otherwise each
// on its own. It writes to src, when not nil, what decided each request
// (SourceStore, or SourceOverLimitCache and SourceHotKey from a decorator
// that answers in process). Resilience (per-call deadline, circuit
// breaker, over-limit cache, hot keys) lives in a store decorator,
// internal/guard; an error means the store did not decide and the failure
// modes apply. The repeated keys of an all-or-nothing call go to the store
// merged (see merge.go).
func (e *Engine) call(ctx context.Context, c *storeCall, all bool, reqs []store.Request, out []sluice.Decision, src []Source) error {
	// One request decides alike either way, and a batch that is not All
	// has the stores' single-check path (on Redis the leanest call).
	c.b = store.Batch{Reqs: reqs, Out: out, All: all && len(reqs) > 1}
	if src != nil {
		c.src = growStoreSource(c.src, len(src))
		c.b.Sources = c.src
	}
	var err error
	mp := c.merged
	c.merged = nil
	if !c.b.All || !mp.of(reqs) {
		mp = mergeAll(&c.plan, &c.b)
	}
	if mp != nil {
		err = doMerged(ctx, e.store, &c.b, mp, c.turn)
	} else {
		c.turn.Pause()
		err = e.store.Do(ctx, &c.b)
		c.turn.Resume(ctx)
	}
	for i := range src {
		src[i] = sourceOf(c.src[i])
	}
	c.b = store.Batch{}
	return err
}

// checkOnce decides s.reqs as one unit under the idempotency key of s, in
// a store that keeps the records, and reports whether the store replayed
// a record.
func (e *Engine) checkOnce(ctx context.Context, s *scratch) (replayed bool, err error) {
	c := &s.call
	c.once = store.Once{Key: s.idemKey, TTL: e.ttl}
	c.b = store.Batch{Reqs: s.reqs, Out: s.out, All: true, Once: &c.once}
	c.turn.Pause()
	err = e.store.Do(ctx, &c.b)
	c.turn.Resume(ctx)
	c.b = store.Batch{}
	return c.once.Replayed, err
}

// sourceOf returns the engine's source of a store's.
func sourceOf(s store.Source) Source {
	switch s {
	case store.SourceOverLimitCache:
		return SourceOverLimitCache
	case store.SourceHotKey:
		return SourceHotKey
	}
	return SourceStore
}

func growStoreSource(src []store.Source, n int) []store.Source {
	if cap(src) < n {
		return make([]store.Source, n)
	}
	return src[:n]
}

// fallback decides the enforcing items of s after the store failed (for
// the reason why), by each rule's failure mode: any fail_closed rule
// denies the check as unavailable (and nothing is consumed locally);
// otherwise the local rules are decided together on the in-process
// limiter with their share of the limit, and the fail_open rules allow.
// A local rule without a share (a limit that denies everything) fails
// closed, and so do the local rules when the in-process limiter fails:
// only a rule written fail_open admits without a bound. When the store
// may have counted the call (maybeCounted: it was given up on after it
// was sent), the local rules fail closed too: a check admitted both by
// the store and locally would pass the limit.
func (e *Engine) fallback(ctx context.Context, s *scratch, now time.Time, why Fallback, maybeCounted bool) bool {
	closed := false
	for _, i := range s.idx {
		it := &s.items[i]
		it.fallback = why
		if it.mode == policy.FailLocal && (maybeCounted || it.local == nil || it.local.Algorithm == 0) {
			it.mode = policy.FailClosed
		}
		if it.mode == policy.FailClosed {
			closed = true
		}
	}
	if !closed {
		var reqs []store.Request
		var idx []int
		for _, i := range s.idx {
			it := &s.items[i]
			if it.mode == policy.FailLocal {
				reqs = append(reqs, store.Request{Key: it.key, Params: it.local, Cost: it.cost, Now: now})
				idx = append(idx, i)
			} else {
				it.dec = sluice.Decision{Allowed: true, Limit: it.params.Limit, Remaining: it.params.Limit}
				it.source = SourceFailOpen
			}
		}
		if len(reqs) == 0 {
			return true
		}
		out := make([]sluice.Decision, len(reqs))
		if err := e.local.Do(ctx, &store.Batch{Reqs: reqs, Out: out, All: true}); err == nil {
			return e.localDecided(s, idx, out)
		}
		for _, i := range idx {
			s.items[i].mode = policy.FailClosed
		}
	}
	for _, i := range s.idx {
		it := &s.items[i]
		it.dec = sluice.Decision{Limit: it.params.Limit}
		if it.mode == policy.FailClosed {
			it.source = SourceFailClosed
		} else {
			it.dec.Allowed = true
			it.source = failSource(it.mode)
		}
	}
	return false
}

// localDecided takes the decisions out of the in-process limiter for the
// items idx of s, and reports whether they all allowed.
func (e *Engine) localDecided(s *scratch, idx []int, out []sluice.Decision) bool {
	allowed := true
	for j := range out {
		if !out[j].Allowed {
			allowed = false
		}
	}
	for j, i := range idx {
		it := &s.items[i]
		it.dec, it.source = out[j], SourceLocal
		if allowed {
			it.charged = it.cost
		} else if !blocking(it.dec) {
			it.dec.Allowed, it.dec.Reason = true, sluice.ReasonAllowed
		}
	}
	return allowed
}

func failSource(m policy.FailureMode) Source {
	switch m {
	case policy.FailClosed:
		return SourceFailClosed
	case policy.FailLocal:
		return SourceLocal
	}
	return SourceFailOpen
}
