package engine

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/store"
)

// This file holds what the engine reports of its decisions: metrics
// (Config.Metrics), audit events (Config.Events) and analytics events
// (Config.Analytics). All are optional and cost nothing when absent. Every
// transport's decisions pass here: HTTP and gRPC checks and batches through
// observeCheck and observeBatch, the requests of limits a transport resolved
// itself (Envoy's calls, see limits.go) through observeItem and
// observeLimits.

// observing reports whether the engine reports anything.
func (e *Engine) observing() bool { return e.metrics != nil || e.events != nil || e.analytics != nil }

// observeCheck records one check c of the request whose context is ctx,
// decided as res (or failed with err), which started at start.
func (e *Engine) observeCheck(ctx context.Context, api metrics.API, start time.Time, c *Check, res *Result, err error) {
	if !e.observing() {
		return
	}
	took := time.Since(start)
	if err != nil {
		e.metrics.Check(api, errOutcome(err), took)
		return
	}
	e.observeResult(ctx, c, res)
	e.metrics.Check(api, outcome(res), took)
	e.record(c, res, took)
}

// observeBatch records a batch of checks of the request whose context is
// ctx, decided as out (or failed with err), which started at start.
func (e *Engine) observeBatch(ctx context.Context, start time.Time, checks []Check, out []Result, err error) {
	if !e.observing() {
		return
	}
	took := time.Since(start)
	if err != nil {
		e.metrics.Check(metrics.APIBatch, errOutcome(err), took)
		return
	}
	o := metrics.OutcomeAllowed
	for i := range out {
		e.observeResult(ctx, &checks[i], &out[i])
		if oi := outcome(&out[i]); oi > o {
			o = oi
		}
		// Each check of a batch is a decision, and took the batch's time.
		e.record(&checks[i], &out[i], took)
	}
	e.metrics.Check(metrics.APIBatch, o, took)
}

// record hands the analytics recorder the decision res of the check c,
// which took took. It copies strings that exist already: no allocation.
func (e *Engine) record(c *Check, res *Result, took time.Duration) {
	if e.analytics == nil {
		return
	}
	e.analytics.Record(analytics.Event{Time: e.clock(c), Client: c.ClientID, Resource: c.Resource, Region: e.region,
		Rule: res.Deciding.Rule, Reason: reason(res), Allowed: res.Allowed, Cost: res.Deciding.Cost, Latency: took})
}

// reason returns why res refused its check, as an analytics reason; ""
// when it was allowed.
func reason(res *Result) string {
	switch {
	case res.Allowed:
		return ""
	case res.Unavailable:
		return analytics.ReasonUnavailable
	case res.Source == SourceDenyList:
		return analytics.ReasonDenyList
	case res.ThrottlePercent > 0:
		return analytics.ReasonThrottled
	}
	return analytics.ReasonOverLimit
}

func outcome(res *Result) metrics.Outcome {
	switch {
	case res.Allowed:
		return metrics.OutcomeAllowed
	case res.Unavailable:
		return metrics.OutcomeUnavailable
	}
	return metrics.OutcomeDenied
}

func errOutcome(err error) metrics.Outcome {
	if errors.Is(err, ErrInvalidCheck) {
		return metrics.OutcomeInvalid
	}
	return metrics.OutcomeError
}

// ruleResult returns the metric result of rr.
func metricResult(rr *RuleResult) metrics.Result {
	switch {
	case rr.Allowed:
		return metrics.Allowed
	case rr.Shadow:
		return metrics.ShadowDenied
	}
	return metrics.Denied
}

// observeResult counts the decisions of res and emits the denial events,
// which carry the request id of ctx.
func (e *Engine) observeResult(ctx context.Context, c *Check, res *Result) {
	if len(res.Rules) == 0 {
		rule := res.Deciding.Rule
		if rule == "" {
			rule = "none"
		}
		e.metrics.Decision(rule, metricResult(&res.Deciding), res.Deciding.Source.String())
	}
	fellBack := -1 // a rule decided without the store
	for i := range res.Rules {
		rr := &res.Rules[i]
		e.metrics.Decision(rr.Rule, metricResult(rr), rr.Source.String())
		if rr.Fallback != FallbackNone {
			e.metrics.StoreFallback(rr.Fallback.String(), rr.Source.String())
			if fellBack < 0 || !rr.Shadow && res.Rules[fellBack].Shadow {
				fellBack = i
			}
		}
		if res.Allowed && rr.Allowed && !rr.Shadow && rr.Cost > 0 {
			e.metrics.NearLimit(rr.Rule, rr.Limit, rr.Remaining)
		}
	}
	if e.events != nil && fellBack >= 0 {
		d := &res.Rules[fellBack]
		if res.Fallback != FallbackNone {
			d = &res.Deciding
		}
		e.events.Fallback(ctx, e.clock(c), &events.Denial{Rule: d.Rule, Tier: d.Tier, Source: d.Source.String(),
			Reason: d.Fallback.String(), ClientID: c.ClientID, User: c.User, IP: c.IP, APIKey: c.APIKey,
			Resource: c.Resource, Limit: d.Limit})
	}
	if e.events == nil || res.Allowed || res.Unavailable || res.Source == SourceIdempotent {
		return
	}
	// Only a check its own rule (or its identity's deny-list entry)
	// denied: a check of an all_or_nothing batch denied because another
	// check was has a deciding rule that allowed it, or no rule at all.
	d := &res.Deciding
	if d.Allowed || len(res.Rules) == 0 {
		return
	}
	e.events.Denied(ctx, e.clock(c), &events.Denial{Rule: d.Rule, Tier: d.Tier, Source: d.Source.String(),
		ClientID: c.ClientID, User: c.User, IP: c.IP, APIKey: c.APIKey, Resource: c.Resource,
		Limit: d.Limit, RetryAfter: d.RetryAfter})
}

// observeItem records the decision of it, an item of a request of
// resolved limits in domain (see limits.go), of the request whose context
// is ctx.
func (e *Engine) observeItem(ctx context.Context, domain string, it *LimitItem) {
	o := &it.Outcome
	r := metrics.Allowed
	if o.refused {
		r = metrics.Denied
		if it.Shadow {
			r = metrics.ShadowDenied
		}
	}
	e.metrics.Decision(it.Rule, r, o.Source.String())
	if o.Fallback != FallbackNone {
		e.metrics.StoreFallback(o.Fallback.String(), o.Source.String())
		if e.events != nil {
			e.events.Fallback(ctx, e.now(), &events.Denial{Rule: it.Rule, Key: o.key, Domain: domain,
				Source: o.Source.String(), Reason: o.Fallback.String(), Limit: it.Limit})
		}
	}
	// Only an item the request was charged for was admitted: when
	// another one is over its limit, none is charged (as for a check's
	// rules), and neither is one of cost 0.
	if r == metrics.Allowed && !it.Shadow && o.Charged > 0 {
		e.metrics.NearLimit(it.Rule, it.Limit, o.Remaining)
	}
	if r == metrics.Denied && e.events != nil {
		e.events.Denied(ctx, e.now(), &events.Denial{Rule: it.Rule, Key: o.key, Domain: domain,
			Source: o.Source.String(), Limit: it.Limit, RetryAfter: o.ResetAfter})
	}
}

// observeLimits records the request of resolved limits l, answered as
// over or failed with err.
//
// Its analytics event is one decision of l.Domain (the resource) for
// l.Client, by l.Rule, of l.Cost.
func (e *Engine) observeLimits(l *Limits, over bool, err error) {
	took := time.Since(l.start)
	o := metrics.OutcomeAllowed
	switch {
	case err != nil:
		o = errOutcome(err)
	case over:
		o = metrics.OutcomeDenied
	}
	e.metrics.Check(l.API, o, took)
	if e.analytics == nil || err != nil {
		return
	}
	ev := analytics.Event{Time: e.now(), Resource: l.Domain, Region: e.region, Allowed: !over, Latency: took,
		Cost: l.Cost, Client: l.Client, Rule: l.Rule}
	if over {
		ev.Reason = analytics.ReasonOverLimit
	}
	e.analytics.Record(ev)
}

// observeStore returns s reporting the duration and errors of its calls
// to m; s itself when m is nil.
func observeStore(s Store, m *metrics.Metrics) Store {
	if m == nil {
		return s
	}
	return &observedStore{s: s, m: m}
}

// observedStore is a Store that times the calls of the store it wraps.
type observedStore struct {
	s Store
	m *metrics.Metrics
}

// Do times the call, under the operation of b: CheckAllOnce (b.Once),
// CheckAll (b.All) or Check.
func (o *observedStore) Do(ctx context.Context, b *store.Batch) error {
	op := metrics.OpCheck
	switch {
	case b.Once != nil:
		op = metrics.OpCheckAllOnce
	case b.All:
		op = metrics.OpCheckAll
	}
	start := time.Now()
	err := o.s.Do(ctx, b)
	o.m.StoreCall(op, time.Since(start), err)
	return err
}

func (o *observedStore) Reset(ctx context.Context, keys ...string) error {
	start := time.Now()
	err := o.s.Reset(ctx, keys...)
	o.m.StoreCall(metrics.OpReset, time.Since(start), err)
	return err
}

func (o *observedStore) Info() store.Info { return o.s.Info() }
