// Resolved limits: a transport that turns its requests into limits itself,
// as the Envoy adapter (internal/envoyrls) matches descriptors against its
// domains, has them decided by the decide step of a check (decide.go) and
// reported as the engine reports its checks (observe.go, trace.go).

package engine

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/share"
)

// Limits is one request whose limits its transport resolved itself. The
// transport starts it (Engine.StartLimits), which picks the policy it is
// resolved on (Limits.Policy); validates it and appends its Items; has
// them decided (Engine.DecideLimits); answers from their outcomes; and
// ends it (Engine.EndLimits), which reports the request and each decided
// item: metrics, audit and analytics events, and a trace span.
//
// A Limits is used by one goroutine. Its zero value is ready for
// StartLimits; it holds nothing once ended.
type Limits struct {
	// API is the API the request came by, as the check metrics count it
	// (metrics.APIEnvoy for Envoy's ShouldRateLimit).
	API metrics.API
	// Domain names the request's set of limits, such as an Envoy domain:
	// the sluice.domain attribute of its span, the resource of its
	// analytics event and the domain of its audit events.
	Domain string
	// Client and Rule are the client and the rule its analytics event
	// names, and Cost is the cost it reports.
	Client, Rule string
	Cost         int64
	// Each decides the enforcing items each on its own: an item over its
	// limit does not keep the others from being charged. Otherwise they
	// are decided all or nothing, as the rules of a check are: when one
	// refuses, none is charged.
	Each bool
	// Items are the request's limits, appended by the transport between
	// StartLimits, which makes it an empty slice of pooled memory, and
	// DecideLimits, which sets their outcomes. They are valid until
	// EndLimits.
	Items []LimitItem
	// Buf is pooled memory the transport may build its keys in: empty
	// after StartLimits, valid until EndLimits.
	Buf []byte

	start  time.Time  // zero when the request is not measured
	span   trace.Span // nil when it is not traced
	policy *policy.Policy
	turn   share.Turn
	bulk   bool // turn paces the request
	small  bool // counted as a small request
	s      *scratch
}

// LimitItem is one limit of a Limits request, resolved by its transport.
type LimitItem struct {
	// Rule names the limit in metrics and audit events.
	Rule string
	// Limit is the limit as metrics and audit events report it, such as
	// requests per window.
	Limit int64
	// Key is the store key of the limit.
	Key string
	// Params are the limit's parameters; nil when its global limit alone
	// decides it. The over-limit cache of the store keys on the pointer:
	// the same limit should come with the same pointer every time.
	Params *algorithm.Params
	// Local is the share of the limit this instance decides alone while
	// the store cannot answer, for the FailLocal mode; nil fails closed.
	Local *algorithm.Params
	// Mode is what happens when the store cannot answer.
	Mode policy.FailureMode
	// Cost is what the item charges, 0 to sluice.MaxLimit; 0 reads.
	Cost int64
	// Shadow items are decided after the enforcing ones, charged when
	// those all allow and only read otherwise; their denials are
	// reported as shadow denials.
	Shadow bool
	// After decides an enforcing item with the shadow ones: being over
	// its limit does not keep the other items from being charged, and it
	// is charged only when they all allow. Its denials are reported as
	// such.
	After bool
	// Global, when set, is a global limit shared by every region (see
	// GlobalView), counted on GlobalKey: the item is over when its limit
	// or its global limit is. With Params nil it alone decides, and while
	// the store cannot answer an instance admits the whole of it on its
	// own. A Shadow or After item's global limit is ignored.
	Global    *algorithm.Params
	GlobalKey string
	// Outcome is set by DecideLimits.
	Outcome LimitOutcome
}

// LimitOutcome is how a LimitItem was decided.
type LimitOutcome struct {
	// Over reports that the limit, or its global limit, refused the item
	// (a store failure that fails open refuses nothing); for a shadow
	// item, that it would have.
	Over bool
	// Remaining and ResetAfter are those of the limit, or of its global
	// limit when the store decided it and fewer remain of it: the limit
	// that reports. ResetAfter is 0 when the decision gave none; the
	// transport may set it before EndLimits, which reports it as the
	// retry-after of a denial.
	Remaining  int64
	ResetAfter time.Duration
	// Source says what decided the limit that reports, and Fallback why
	// not the store, when it did not.
	Source   Source
	Fallback Fallback
	// Charged is what the limit that reports counted.
	Charged int64

	decided bool
	refused bool   // the limit that reports refused the item
	key     string // of the limit that reports
}

// StartLimits starts l, a request of n parts (such as descriptors) whose
// limits its transport resolves itself, and returns the context to decide
// it in. A request of more than Config.BulkChecks parts takes its share of
// the time (see Config.BulkShare). EndLimits must end it.
func (e *Engine) StartLimits(ctx context.Context, l *Limits, n int) context.Context {
	if e.tracer != nil && e.sampled(ctx) {
		ctx, l.span = e.tracer.Start(ctx, spanLimits, serverSpan...)
	}
	if e.metrics != nil || e.analytics != nil {
		l.start = time.Now()
	}
	if e.share.Bulk(n) {
		l.turn, l.bulk = e.share.StartBulk(ctx), true
	} else {
		l.small = e.share.StartSmall()
	}
	l.policy = e.policy.Load()
	l.s = e.getScratch()
	l.Items, l.Buf = l.s.limits[:0], l.s.keys[:0]
	return ctx
}

// Policy returns the policy l is resolved and decided on: the one in force
// when it started.
func (l *Limits) Policy() *policy.Policy { return l.policy }

// Next lets a bulk request wait its turn before it resolves part i of its
// n (see Config.BulkShare); it returns at once for a small one.
func (l *Limits) Next(ctx context.Context, i int) {
	if i%planSlice == planSlice-1 {
		l.pace().Next(ctx)
	}
}

// pace returns the turn of a bulk request; nil for a small one.
func (l *Limits) pace() *share.Turn {
	if !l.bulk {
		return nil
	}
	return &l.turn
}

// DecideLimits decides the items of l, started by StartLimits: the
// enforcing ones in one store call (all or nothing, unless l.Each), then
// the shadow and After ones. Store failures are decided by each item's
// failure mode. It sets each item's Outcome; its error, a *FieldError,
// reports an item that cannot be decided, before any is.
func (e *Engine) DecideLimits(ctx context.Context, l *Limits) error {
	if len(l.Items) == 0 {
		return nil
	}
	s := l.s
	// s.ends holds, per item of l, the index of its item in s and that of
	// its global item (-1 without one). An item that cannot be decided
	// leaves s to EndLimits, which clears it.
	for i := range l.Items {
		li := &l.Items[i]
		switch {
		case li.Params == nil && li.Global == nil:
			return &FieldError{Field: "items[" + strconv.Itoa(i) + "]", Reason: "has no limit"}
		case li.Cost < 0 || li.Cost > sluice.MaxLimit:
			return &FieldError{Field: "items[" + strconv.Itoa(i) + "].cost", Reason: "must be between 0 and " + strconv.FormatInt(sluice.MaxLimit, 10)}
		}
		it := item{mode: li.Mode, cost: li.Cost}
		if li.Params == nil {
			// The global limit alone, whose local share is the whole limit.
			g := globalItem(&it, li.Global, li.Global, e.now())
			g.key = li.GlobalKey
			s.items = append(s.items, g)
			s.globals++
			s.ends = append(s.ends, len(s.items)-1, -1)
			continue
		}
		it.params, it.shadow, it.key = li.Params, li.Shadow || li.After, li.Key
		if it.mode == policy.FailLocal {
			it.local = li.Local
		}
		s.items = append(s.items, it)
		s.ends = append(s.ends, len(s.items)-1, -1)
		if li.Global != nil && !it.shadow {
			g := globalItem(&it, li.Global, nil, e.now())
			g.key = li.GlobalKey
			s.items = append(s.items, g)
			s.globals++
			s.ends[len(s.ends)-1] = len(s.items) - 1
		}
	}
	e.resolveGlobal(s)
	s.call.turn = l.pace() // pauses while waiting on the store
	// A request whose limits take too much store work to be decided in
	// one atomic call (see fitsAtomic) is decided limit by limit: a
	// transport such as Envoy's could not send it otherwise.
	all := !l.Each
	if all {
		_, all = e.fitsAtomic(s, time.Time{})
	}
	e.run(ctx, s, time.Time{}, all)
	for i := range l.Items {
		it := &s.items[s.ends[2*i]]
		over := blocking(it.dec) && it.source != SourceFailOpen
		if gi := s.ends[2*i+1]; gi >= 0 {
			// Over when the limit or its global limit is; the one with
			// fewer remaining reports.
			g := &s.items[gi]
			over = over || blocking(g.dec) && g.source != SourceFailOpen
			if g.source == SourceStore && g.dec.Remaining < it.dec.Remaining {
				it = g
			}
		}
		l.Items[i].Outcome = LimitOutcome{Over: over, Remaining: it.dec.Remaining, ResetAfter: it.dec.ResetAfter,
			Source: it.source, Fallback: it.fallback, Charged: it.charged,
			decided: true, refused: blocking(it.dec) && it.source != SourceFailOpen, key: it.key}
	}
	return nil
}

// EndLimits ends l, answered as over (any limit refused the request) or
// failed with err: it reports each decided item and the request, and
// ends its span. ctx is the context StartLimits returned.
func (e *Engine) EndLimits(ctx context.Context, l *Limits, over bool, err error) {
	if err == nil && e.observing() {
		for i := range l.Items {
			if l.Items[i].Outcome.decided {
				e.observeItem(ctx, l.Domain, &l.Items[i])
			}
		}
	}
	if l.bulk {
		l.turn.End()
	} else {
		e.share.EndSmall(l.small)
	}
	if !l.start.IsZero() {
		e.observeLimits(l, over, err)
	}
	if l.span != nil {
		endLimits(l.span, l.Domain, over, err)
	}
	if l.s != nil {
		clear(l.Items)
		l.s.limits, l.s.keys = l.Items[:0], l.Buf[:0]
		e.putScratch(l.s)
	}
	l.Items, l.Buf, l.span, l.policy, l.s = nil, nil, nil, nil, nil
}
