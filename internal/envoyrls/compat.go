// The compatibility mode's limits: fixed windows that count the hits they
// refuse, as envoyproxy/ratelimit counts them.

package envoyrls

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
)

// compatCache holds the Params of the Envoy limits of a policy as the
// compatibility mode decides them (see compatCache.of). The zero value is
// empty and ready; it is safe for concurrent use.
type compatCache struct {
	cur atomic.Pointer[compatParams]
}

// compatParams holds, for the policy pol, the Params of its Envoy limits
// as the compatibility mode decides them, by the Params they are made
// from.
type compatParams struct {
	pol *policy.Policy
	m   sync.Map // *algorithm.Params -> *algorithm.Params
}

// of returns the Params an Envoy limit of p, of the policy pol, is decided
// with: p itself, or with compat, for a fixed window, p counting the hits
// it refuses, and a limit of 0 counted as such (rather than denying every
// request, reads included, without a count). The copies are kept per
// policy, so that their pointers are stable, as the over-limit cache of
// the store needs.
func (c *compatCache) of(compat bool, pol *policy.Policy, p *algorithm.Params) *algorithm.Params {
	if !compat || p.Algorithm != sluice.FixedWindow {
		return p
	}
	cp := c.cur.Load()
	if cp == nil || cp.pol != pol {
		// A new policy: the copies of the previous one are dropped.
		// (Calls still running on it during a reload make copies that
		// are not kept, which only costs over-limit cache hits.)
		cp = &compatParams{pol: pol}
		c.cur.Store(cp)
	}
	if v, ok := cp.m.Load(p); ok {
		return v.(*algorithm.Params)
	}
	v, _ := cp.m.LoadOrStore(p, compatOf(p))
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
