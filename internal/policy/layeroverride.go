// The typed compile path of the layer's overrides.

package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// sameParents reports whether the rules named by parents would still have
// an override inherit from the same compiled limits under tier.
func sameParents(parents map[string]*Limit, byID map[string]*Rule, tier string) bool {
	for id, l := range parents {
		r := byID[id]
		if r == nil || r.LimitFor(tier, nil) != l {
			return false
		}
	}
	return true
}

// compileOverride compiles lo's limits for an identity of tier, on the
// typed path: each limit inherits the fields it leaves zero from the limit
// the rule applies to the tier, and counts at the quantum of the rule's
// limits of its algorithm and window, so that its key is theirs.
func compileOverride(lo *LayerOverride, tier string, byID map[string]*Rule, st *settings) (*overrideEntry, *LayerError) {
	bad := func(field, msg string) (*overrideEntry, *LayerError) {
		return nil, &LayerError{Object: "override", ID: lo.ID, Field: field, Msg: msg}
	}
	e := &overrideEntry{version: lo.Version, tier: tier, parents: make(map[string]*Limit, len(lo.Limits)),
		o: &override{id: lo.ID, version: lo.Version, expiresAt: lo.ExpiresAt, limits: make(map[string]*Limit, len(lo.Limits))}}
	ids := make([]string, 0, len(lo.Limits))
	for id := range lo.Limits {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ll := lo.Limits[id]
		f := "limits." + id
		r := byID[id]
		if r == nil {
			return bad(f, "unknown rule id")
		}
		parent := r.LimitFor(tier, nil)
		if parent == nil {
			return bad(f, fmt.Sprintf("rule %q has no limit for tier %q", id, tier))
		}
		b := parent.Spec
		spec := limitSpec{alg: b.Algorithm, limit: b.Limit, window: b.Window, burst: b.Burst, hasLim: true, hasWin: true, hasBur: b.Burst > 0}
		if ll.Algorithm != "" {
			a, err := sluice.ParseAlgorithm(ll.Algorithm)
			if err != nil {
				return bad(f+".algorithm", err.Error())
			}
			spec.alg = a
		}
		switch {
		case ll.Limit < 0 || ll.Limit > sluice.MaxLimit:
			return bad(f+".limit", fmt.Sprintf("must be between 1 and %d, got %d", int64(sluice.MaxLimit), ll.Limit))
		case ll.Limit > 0:
			spec.limit = ll.Limit
		}
		switch {
		case ll.Window < 0 || ll.Window > sluice.MaxWindow || ll.Window%time.Microsecond != 0:
			return bad(f+".window", fmt.Sprintf("must be a whole number of microseconds up to %s, got %s", sluice.MaxWindow, ll.Window))
		case ll.Window > 0:
			spec.window = ll.Window
		}
		switch {
		case ll.Burst < 0 || ll.Burst > sluice.MaxLimit:
			return bad(f+".burst", fmt.Sprintf("must be between 1 and %d, got %d", int64(sluice.MaxLimit), ll.Burst))
		case ll.Burst > 0:
			spec.burst, spec.hasBur = ll.Burst, true
		}
		q := int64(1)
		for _, rl := range r.Limits() {
			if rl.Spec.Algorithm == spec.alg && rl.Spec.Window == spec.window {
				q = max(q, rl.Params[0].Quantum)
			}
		}
		d := &decoder{file: "override"}
		l := d.compile(spec, st, r.FailureMode, r.ExpectedInstances, f, q)
		if l == nil {
			msg := "cannot be compiled"
			var ce *ConfigError
			if len(d.errs) > 0 && errors.As(d.errs[0], &ce) {
				msg = strings.TrimPrefix(ce.Msg, f+": ")
			}
			return bad(f, msg)
		}
		e.parents[id] = parent
		e.o.limits[id] = l
	}
	return e, nil
}
