// The Envoy rate-limit service's entry point, ShouldRateLimit: descriptors
// planned into items, decided and answered as Envoy expects, with the
// compatibility mode of envoyproxy/ratelimit.

package engine

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/share"
)

// compatParams holds, for the policy pol, the Params of its Envoy limits
// as envoyCompat decides them (see envoyParams), by the Params they are
// made from.
type compatParams struct {
	pol *policy.Policy
	m   sync.Map // *algorithm.Params -> *algorithm.Params
}

// envoyParams returns the Params an Envoy limit of p is decided with:
// p itself, or with EnvoyCompat, for a fixed window, p counting the hits
// it refuses, and a limit of 0 counted as such (rather than denying every
// request, reads included, without a count). The copies are kept per
// policy, so that their pointers are stable, as the over-limit cache needs.
func (e *Engine) envoyParams(pol *policy.Policy, p *algorithm.Params) *algorithm.Params {
	if !e.envoyCompat || p.Algorithm != sluice.FixedWindow {
		return p
	}
	c := e.compat.Load()
	if c == nil || c.pol != pol {
		// A new policy: the copies of the previous one are dropped.
		// (Checks still running on it during a reload make copies that
		// are not kept, which only costs over-limit cache hits.)
		c = &compatParams{pol: pol}
		e.compat.Store(c)
	}
	if v, ok := c.m.Load(p); ok {
		return v.(*algorithm.Params)
	}
	v, _ := c.m.LoadOrStore(p, compatOf(p))
	return v.(*algorithm.Params)
}

// compatOf returns a copy of p, a fixed window, that counts the hits it
// refuses; a deny-all p becomes a limit of 0 that does.
func compatOf(p *algorithm.Params) *algorithm.Params {
	c := *p
	c.CountRefused = true
	if c.DenyAll {
		c.DenyAll, c.Limit, c.Burst, c.ExpiryLimit = false, 0, 0, 0
	}
	return &c
}

// Descriptor is one Envoy rate-limit descriptor: an ordered list of
// key/value entries, with an optional per-descriptor hits addend.
type Descriptor struct {
	Entries []DescriptorEntry
	// HitsAddend is what the descriptor is charged, in place of the
	// request's addend, when HitsSet is true; 0 then decides it without
	// consuming anything. It is ignored when HitsSet is false.
	HitsAddend uint64
	// HitsSet reports that the descriptor carries its own HitsAddend.
	HitsSet bool
	// Limit, when set, is the limit the descriptor asks for in place of
	// the configured one (Envoy's limit override).
	Limit LimitOverride
}

// LimitOverride is an Envoy descriptor's limit override: RequestsPerUnit
// per Unit, counted on fixed windows. The zero value is no override.
type LimitOverride struct {
	// RequestsPerUnit is the limit, 1 to math.MaxUint32.
	RequestsPerUnit int64
	// Unit is the window, such as a minute, or 30 seconds for a unit of a
	// second with a multiplier of 30; at most sluice.MaxWindow.
	Unit time.Duration
}

// DescriptorEntry is one key/value pair of a Descriptor.
type DescriptorEntry = policy.DescriptorEntry

// DescriptorStatus is the answer for one descriptor, as Envoy expects it.
type DescriptorStatus struct {
	OverLimit bool
	// HasLimit is false when no rule matched the descriptor (Envoy's OK
	// with no current_limit), and for unlimited descriptors.
	HasLimit bool
	// Limit is requests per Unit (Envoy's current_limit).
	Limit int64
	Unit  time.Duration
	// Remaining is Envoy's limit_remaining; math.MaxUint32 for an
	// unlimited descriptor.
	Remaining          int64
	DurationUntilReset time.Duration
	// Rule is the configuration entry's full key, such as
	// "messaging.message_type_marketing.to_number"; "" when none matched.
	Rule string
	// Shadow reports a shadow_mode limit: it never reports over limit.
	Shadow bool
}

// ShouldRateLimit decides Envoy descriptors for domain, each charged
// hitsAddend (0 means 1) unless the descriptor sets its own (HitsSet),
// which may be 0: the descriptor is then decided without being charged.
// overLimit is true when any descriptor is over its limit, but for
// quota_mode ones (policy.EnvoyLimit.QuotaMode): those report OverLimit in
// their own status, and make overLimit true only when every quota_mode
// descriptor of the request is over its limit, as in envoyproxy/ratelimit.
//
// The descriptors are matched as envoyproxy/ratelimit does (see
// policy.Policy.EnvoyLimit), a descriptor's limit override replaces what
// it matched in a domain of the policy (see policy.Policy.EnvoyOverride),
// `replaces` drops the limits it names, and the
// limits that remain are decided like the rules of one check: the
// non-shadow ones in one CheckAll (a request over one limit consumes none
// of the others), then the shadow and quota_mode ones. Store failures are
// decided by each limit's failure mode (local by default).
//
// With Config.EnvoyCompat, as envoyproxy/ratelimit: the non-shadow limits
// are decided each on its own (a request over one limit is counted on the
// others), fixed windows count the hits they refuse (so that a window
// stays over its limit until it ends, check-only descriptors included), a
// requests_per_unit of 0 is such a window (it admits check-only
// descriptors until a hit is counted), and a descriptor with no entries
// is not limited instead of refused.
func (e *Engine) ShouldRateLimit(ctx context.Context, domain string, descs []Descriptor, hitsAddend uint64) (statuses []DescriptorStatus, overLimit bool, err error) {
	if e.tracer != nil && e.sampled(ctx) {
		var span trace.Span
		ctx, span = e.tracer.Start(ctx, spanEnvoy, serverSpan...)
		defer func() { endEnvoy(span, domain, overLimit, err) }()
	}
	if e.metrics != nil || e.analytics != nil {
		defer e.observeEnvoy(time.Now(), domain, descs, hitsAddend, &overLimit, &err)
	}
	if domain == "" {
		return nil, false, &FieldError{Field: "domain", Reason: "is required"}
	}
	if len(descs) == 0 {
		return nil, false, &FieldError{Field: "descriptors", Reason: "must not be empty"}
	}
	if len(descs) > MaxBatch {
		return nil, false, &FieldError{Field: "descriptors", Reason: "more than " + strconv.Itoa(MaxBatch) + " descriptors"}
	}
	if hitsAddend > MaxCost {
		return nil, false, &FieldError{Field: "hits_addend", Reason: "must be at most " + strconv.Itoa(MaxCost)}
	}
	for i, d := range descs {
		if d.HitsAddend > MaxCost {
			return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].hits_addend", Reason: "must be at most " + strconv.Itoa(MaxCost)}
		}
		if len(d.Entries) == 0 && !e.envoyCompat {
			return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries", Reason: "must not be empty"}
		}
		if o := d.Limit; o != (LimitOverride{}) {
			if o.RequestsPerUnit < 1 || o.RequestsPerUnit > math.MaxUint32 {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.requests_per_unit", Reason: "must be between 1 and " + strconv.Itoa(math.MaxUint32)}
			}
			if o.Unit <= 0 || o.Unit > sluice.MaxWindow {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.unit", Reason: "must be a window longer than 0 and at most " + sluice.MaxWindow.String()}
			}
		}
		for j, en := range d.Entries {
			if en.Key == "" {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries[" + strconv.Itoa(j) + "].key", Reason: "is required"}
			}
			if len(en.Key) > MaxEntryLen || len(en.Value) > MaxEntryLen {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries[" + strconv.Itoa(j) + "]", Reason: "longer than " + strconv.Itoa(MaxEntryLen) + " bytes"}
			}
		}
	}
	// A call of many descriptors takes its share of the time (see
	// Config.BulkShare); a smaller one counts as a small request.
	var turn *share.Turn
	if e.share.Bulk(len(descs)) {
		t := e.share.StartBulk(ctx)
		defer t.End()
		turn = &t
	} else {
		small := e.share.StartSmall()
		defer e.share.EndSmall(small)
	}
	p := e.policy.Load()
	var lbuf [4]*policy.EnvoyLimit // the common case, without an allocation
	limits := lbuf[:0]
	var replaced map[string]bool
	for i := range descs {
		if i%planSlice == planSlice-1 {
			turn.Next(ctx)
		}
		if o := descs[i].Limit; o.Unit != 0 {
			l, err := p.EnvoyOverride(domain, o.RequestsPerUnit, o.Unit)
			if err != nil {
				return nil, false, &FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit", Reason: err.Error()}
			}
			limits = append(limits, l)
		} else if len(descs[i].Entries) == 0 {
			limits = append(limits, nil) // (EnvoyCompat) not limited
		} else {
			limits = append(limits, p.EnvoyLimit(domain, descs[i].Entries))
		}
		if l := limits[i]; l != nil && len(l.Replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, n := range l.Replaces {
				replaced[n] = true
			}
		}
	}
	statuses = make([]DescriptorStatus, len(descs))
	type ref struct{ desc, item, global int } // global: -1 without a global limit
	var rbuf [4]ref
	refs := rbuf[:0]
	s := e.getScratch()
	defer e.putScratch(s)
	for i, l := range limits {
		if l == nil || (l.Name != "" && replaced[l.Name]) {
			continue
		}
		if l.Unlimited {
			statuses[i] = DescriptorStatus{Remaining: math.MaxUint32, Rule: l.FullKey}
			continue
		}
		hits := max(hitsAddend, 1)
		if descs[i].HitsSet {
			hits = descs[i].HitsAddend
		}
		if l.GlobalOnly() {
			// The global limit alone: one item, whose local share is the
			// whole limit (an Envoy file names no expected instances).
			it := item{mode: l.FailureMode, cost: int64(hits)}
			g := globalItem(&it, l.Global, l.Global, e.now())
			g.key = string(l.AppendGlobalKey(s.keys[:0], descs[i].Entries))
			s.items = append(s.items, g)
			s.globals++
			refs = append(refs, ref{i, len(s.items) - 1, -1})
			continue
		}
		s.keys = l.AppendKey(s.keys[:0], descs[i].Entries)
		// A quota is decided with the shadow limits: its being over
		// does not keep the others from being consumed.
		it := item{params: e.envoyParams(p, &l.Limit.Params[PriorityNormal]), mode: l.FailureMode,
			shadow: l.Shadow || l.QuotaMode, cost: int64(hits), key: string(s.keys), limit: l.Limit}
		if it.mode == policy.FailLocal {
			it.local = &l.Limit.Local[PriorityNormal]
		}
		s.items = append(s.items, it)
		rf := ref{i, len(s.items) - 1, -1}
		if l.Global != nil && !it.shadow {
			g := globalItem(&it, l.Global, nil, e.now())
			g.key = string(l.AppendGlobalKey(s.keys[:0], descs[i].Entries))
			s.items = append(s.items, g)
			s.globals++
			rf.global = len(s.items) - 1
		}
		refs = append(refs, rf)
	}
	if len(s.items) == 0 {
		return statuses, false, nil
	}
	e.resolveGlobal(s)
	s.call.turn = turn // pauses while waiting on the store
	// With EnvoyCompat each descriptor is decided on its own, so that a
	// request over one limit counts on the others too; so is each of a
	// request whose limits take too much store work to be decided in one
	// atomic call (see fitsAtomic): Envoy could not send it otherwise.
	all := !e.envoyCompat
	if all {
		_, all = e.fitsAtomic(s, time.Time{})
	}
	e.run(ctx, s, time.Time{}, all)
	quotas, quotasOver := 0, 0
	for _, r := range refs {
		it := &s.items[r.item]
		l := limits[r.desc]
		over := blocking(it.dec) && it.source != SourceFailOpen
		if r.global >= 0 {
			// The descriptor is over when its limit or its global limit
			// is; it reports the smaller remaining.
			g := &s.items[r.global]
			over = over || blocking(g.dec) && g.source != SourceFailOpen
			if g.source == SourceStore && g.dec.Remaining < it.dec.Remaining {
				it = g
			}
		}
		st := DescriptorStatus{HasLimit: true, Limit: l.RequestsPerUnit, Unit: l.Unit,
			Remaining: it.dec.Remaining, DurationUntilReset: it.dec.ResetAfter, Rule: l.FullKey, Shadow: l.Shadow}
		if l.QuotaMode && !l.Shadow {
			quotas++
		}
		if over && !l.Shadow {
			st.OverLimit = true
			if l.QuotaMode {
				quotasOver++
			} else {
				overLimit = true
			}
		}
		if st.DurationUntilReset == 0 {
			st.DurationUntilReset = untilWindowEnd(e.now(), l.Unit)
		}
		e.observeDescriptor(ctx, domain, it, &st)
		statuses[r.desc] = st
	}
	if quotas > 0 && quotasOver == quotas {
		overLimit = true
	}
	return statuses, overLimit, nil
}

// untilWindowEnd returns the time from now to the end of the current
// window of length unit, aligned on the Unix epoch.
func untilWindowEnd(now time.Time, unit time.Duration) time.Duration {
	if unit <= 0 {
		return 0
	}
	us := now.UnixMicro()
	w := unit.Microseconds()
	return time.Duration(w-us%w) * time.Microsecond
}
