// The first step of an Envoy call, plan: the descriptors are checked,
// matched against the domains of the policy, and become the limits the
// engine decides (engine.Limits).

package envoyrls

import (
	"context"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
)

// Decider decides Envoy descriptors on an engine: it matches them against
// the domains of the engine's policy, as envoyproxy/ratelimit does, and
// has the engine decide the limits they match, as it decides the rules of
// a check. It is safe for concurrent use.
type Decider struct {
	eng    *engine.Engine
	compat bool
	params compatCache // with compat
}

// NewDecider returns the Decider of Envoy descriptors on eng; with compat,
// they are decided as envoyproxy/ratelimit decides them where Sluice
// differs (see ShouldRateLimit). Every instance sharing a store should
// decide alike.
func NewDecider(eng *engine.Engine, compat bool) *Decider {
	return &Decider{eng: eng, compat: compat}
}

// ShouldRateLimit decides Envoy descriptors for domain, each charged
// hitsAddend (0 means 1) unless the descriptor sets its own (HitsSet),
// which may be 0: the descriptor is then decided without being charged.
// overLimit is true when any descriptor is over its limit, but for
// quota_mode ones (policy.EnvoyLimit.QuotaMode): those report OverLimit in
// their own status, and make overLimit true only when every quota_mode
// descriptor of the request is over its limit, as in envoyproxy/ratelimit.
// Its error, for bad input, is an *engine.FieldError naming the field.
//
// The descriptors are matched as envoyproxy/ratelimit does (see
// policy.Policy.EnvoyLimit), a descriptor's limit override replaces what
// it matched in a domain of the policy (see policy.Policy.EnvoyOverride),
// `replaces` drops the limits it names, and the limits that remain are
// decided like the rules of one check (engine.Engine.DecideLimits): the
// non-shadow ones in one store call, all or nothing (a request over one
// limit consumes none of the others), then the shadow and quota_mode ones.
// Store failures are decided by each limit's failure mode (local by
// default).
//
// With compat, as envoyproxy/ratelimit: the non-shadow limits are decided
// each on its own (a request over one limit is counted on the others),
// fixed windows count the hits they refuse (so that a window stays over
// its limit until it ends, check-only descriptors included), a
// requests_per_unit of 0 is such a window (it admits check-only
// descriptors until a hit is counted), and a descriptor with no entries is
// not limited instead of refused.
func (d *Decider) ShouldRateLimit(ctx context.Context, domain string, descs []Descriptor, hitsAddend uint64) (statuses []DescriptorStatus, overLimit bool, err error) {
	return d.shouldRateLimit(ctx, domain, descs, hitsAddend, nil)
}

// Answer is the answer of a request, with the memory it is built in, for
// a caller that decides many requests of many descriptors to reuse (from a
// sync.Pool, say) rather than have each allocate its own: some 6 KB for
// 64 descriptors, whose garbage collections slow every other request of
// the process. The zero value is ready to use. An Answer is used by one
// goroutine at a time.
type Answer struct {
	// Statuses holds the status of each descriptor of the last request,
	// in order, as ShouldRateLimit returns them; empty after an error.
	// They are valid until the answer is used again.
	Statuses []DescriptorStatus
	// OverLimit is the request's verdict, as ShouldRateLimit returns it.
	OverLimit bool

	limits []*policy.EnvoyLimit
	refs   []int
}

// ShouldRateLimitInto is ShouldRateLimit writing its answer into a, whose
// memory it reuses.
func (d *Decider) ShouldRateLimitInto(ctx context.Context, domain string, descs []Descriptor, hitsAddend uint64, a *Answer) error {
	a.Statuses, a.OverLimit = a.Statuses[:0], false
	statuses, over, err := d.shouldRateLimit(ctx, domain, descs, hitsAddend, a)
	if err != nil {
		a.Statuses = a.Statuses[:0]
		return err
	}
	a.Statuses, a.OverLimit = statuses, over
	return nil
}

// shouldRateLimit is ShouldRateLimit, in the memory of a when not nil.
func (d *Decider) shouldRateLimit(ctx context.Context, domain string, descs []Descriptor, hitsAddend uint64, a *Answer) (statuses []DescriptorStatus, overLimit bool, err error) {
	l := engine.Limits{API: metrics.APIEnvoy, Domain: domain, Cost: int64(max(hitsAddend, 1)), Each: d.compat}
	if len(descs) > 0 && len(descs[0].Entries) > 0 {
		// The analytics event's client is the value of the first entry
		// (such as the remote address of descriptors that start with
		// it), its rule that entry's key.
		l.Client, l.Rule = descs[0].Entries[0].Value, descs[0].Entries[0].Key
	}
	ctx = d.eng.StartLimits(ctx, &l, len(descs))
	defer func() { d.eng.EndLimits(ctx, &l, overLimit, err) }()
	if err := validate(domain, descs, hitsAddend, d.compat); err != nil {
		return nil, false, err
	}
	var lbuf [4]*policy.EnvoyLimit // the common case, without an allocation
	limits := lbuf[:0]
	if len(descs) > len(lbuf) {
		// Not grown step by step; a's when reused.
		if a == nil || cap(a.limits) < len(descs) {
			m := make([]*policy.EnvoyLimit, 0, len(descs))
			if a != nil {
				a.limits = m
			}
			limits = m
		} else {
			limits = a.limits[:0]
		}
	}
	limits, err = d.match(ctx, &l, domain, descs, limits)
	if err != nil {
		return nil, false, err
	}
	if a == nil || cap(a.Statuses) < len(descs) {
		statuses = make([]DescriptorStatus, len(descs))
	} else {
		statuses = a.Statuses[:len(descs)]
		clear(statuses)
	}
	var rbuf [4]int
	refs := rbuf[:0]
	if len(descs) > len(rbuf) {
		if a == nil || cap(a.refs) < len(descs) {
			m := make([]int, 0, len(descs))
			if a != nil {
				a.refs = m
			}
			refs = m
		} else {
			refs = a.refs[:0]
		}
	}
	refs = d.plan(&l, limits, descs, hitsAddend, statuses, refs)
	if len(l.Items) == 0 {
		return statuses, false, nil
	}
	if err := d.eng.DecideLimits(ctx, &l); err != nil {
		return nil, false, err
	}
	return statuses, d.answer(&l, limits, refs, statuses), nil
}

// match appends to limits the limit of each descriptor of descs in domain,
// on the policy of l: its override's, the one it matches, or nil when none
// matches (or it has no entries).
func (d *Decider) match(ctx context.Context, l *engine.Limits, domain string, descs []Descriptor, limits []*policy.EnvoyLimit) ([]*policy.EnvoyLimit, error) {
	p := l.Policy()
	for i := range descs {
		l.Next(ctx, i)
		var el *policy.EnvoyLimit
		if o := descs[i].Limit; o.Unit != 0 {
			var err error
			if el, err = p.EnvoyOverride(domain, o.RequestsPerUnit, o.Unit); err != nil {
				return nil, &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit", Reason: err.Error()}
			}
		} else if len(descs[i].Entries) > 0 {
			el = p.EnvoyLimit(domain, descs[i].Entries)
		}
		limits = append(limits, el)
	}
	return limits, nil
}

// plan appends to l.Items the item of each limit of limits (of the
// descriptor of the same index) that applies, and returns refs, the index
// of each item's descriptor. Unlimited descriptors are answered in
// statuses at once; unmatched ones, and those whose limit another one
// `replaces`, have no item and keep a zero status.
func (d *Decider) plan(l *engine.Limits, limits []*policy.EnvoyLimit, descs []Descriptor, hitsAddend uint64, statuses []DescriptorStatus, refs []int) []int {
	var replaced map[string]bool
	for _, el := range limits {
		if el != nil && len(el.Replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, n := range el.Replaces {
				replaced[n] = true
			}
		}
	}
	p := l.Policy()
	for i, el := range limits {
		if el == nil || (el.Name != "" && replaced[el.Name]) {
			continue
		}
		if el.Unlimited {
			statuses[i] = DescriptorStatus{Remaining: math.MaxUint32, Rule: el.FullKey}
			continue
		}
		hits := max(hitsAddend, 1)
		if descs[i].HitsSet {
			hits = descs[i].HitsAddend
		}
		// A quota is decided with the shadow limits: its being over does
		// not keep the others from being consumed.
		it := engine.LimitItem{Rule: el.FullKey, Limit: el.RequestsPerUnit, Mode: el.FailureMode, Cost: int64(hits),
			Shadow: el.Shadow, After: el.QuotaMode && !el.Shadow}
		if !el.GlobalOnly() {
			l.Buf = el.AppendKey(l.Buf[:0], descs[i].Entries)
			it.Key = lastKey(l.Items, l.Buf, false)
			it.Params = d.params.of(d.compat, p, &el.Limit.Params[engine.PriorityNormal])
			if it.Mode == policy.FailLocal {
				it.Local = &el.Limit.Local[engine.PriorityNormal]
			}
		}
		// The global limit of a descriptor that enforces (a shadow or
		// quota one has none), alone or beside its limit; alone, each
		// instance admits the whole of it while the store cannot answer
		// (an Envoy file names no expected instances).
		if el.GlobalOnly() || el.Global != nil && !el.Shadow && !el.QuotaMode {
			it.Global = el.Global
			l.Buf = el.AppendGlobalKey(l.Buf[:0], descs[i].Entries)
			it.GlobalKey = lastKey(l.Items, l.Buf, true)
		}
		l.Items = append(l.Items, it)
		refs = append(refs, i)
	}
	return refs
}

// lastKey returns key as a string: the last item's key (its global key,
// with global) when it is the same, so that the many descriptors of one
// key that a client may send in one request allocate it once.
func lastKey(items []engine.LimitItem, key []byte, global bool) string {
	if len(items) > 0 {
		last := &items[len(items)-1]
		k := last.Key
		if global {
			k = last.GlobalKey
		}
		if k == string(key) {
			return k
		}
	}
	return string(key)
}
