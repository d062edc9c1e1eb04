// The first step of a check, plan: the policy turns the check into items,
// one limit operation per rule that applies, each with its store key, its
// cost and the parameters of the check's priority.

package engine

import (
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
)

// item is one rule (or resolved limit, see limits.go) applied to one check.
type item struct {
	check  int // index of the check in its batch
	rule   *policy.Rule
	limit  *policy.Limit
	tier   string
	params *algorithm.Params
	local  *algorithm.Params
	mode   policy.FailureMode
	shadow bool
	cost   int64
	key    string
	// throttle is the percent by which a throttle cut the limit.
	throttle float64
	// gbase is set on the item of a global limit (see global.go): glimit
	// is that limit (cut by a throttle), and at the instant that picks
	// its window, given to the store so that its window is the one the
	// sync names.
	gbase  *algorithm.Params
	glimit int64
	at     time.Time
	// the outcome
	dec      sluice.Decision
	source   Source
	fallback Fallback // why the store did not decide, when it did not
	charged  int64
}

// scratch holds the per-check buffers, pooled.
type scratch struct {
	rules []*policy.Rule
	items []item
	// limits holds the items of a request of resolved limits (see
	// limits.go), which the transport appends.
	limits []LimitItem
	keys   []byte
	ends   []int
	reqs   []store.Request
	out    []sluice.Decision
	src    []Source
	idx    []int
	call   storeCall
	// decided marks the checks of an all-or-nothing batch that the allow
	// and deny lists decided.
	decided []bool
	// gparams holds the params of the check's global items, whose limit
	// changes from check to check.
	gparams []algorithm.Params
	globals int // the number of global items
	// idemKey is the store key of the check's idempotency record, when
	// the store keeps them (Info().SharedRecords).
	idemKey string
	// replayed reports that the store answered from an idempotency record.
	replayed bool
}

func (e *Engine) getScratch() *scratch {
	s := e.pool.Get().(*scratch)
	s.rules, s.items, s.keys, s.ends, s.reqs, s.out, s.idx = s.rules[:0], s.items[:0], s.keys[:0], s.ends[:0], s.reqs[:0], s.out[:0], s.idx[:0]
	s.idemKey, s.replayed, s.globals = "", false, 0
	s.call.turn, s.call.merged = nil, nil
	return s
}

func (e *Engine) putScratch(s *scratch) {
	if cap(s.items) > 1024 || cap(s.keys) > 1<<16 || cap(s.limits) > 1024 {
		return
	}
	clear(s.rules[:cap(s.rules)])
	clear(s.items[:cap(s.items)])
	clear(s.reqs[:cap(s.reqs)])
	s.call.plan.release()
	e.pool.Put(s)
}

func request(c *Check) policy.Request {
	return policy.Request{ClientID: c.ClientID, User: c.User, IP: c.IP, APIKey: c.APIKey,
		Resource: c.Resource, Method: c.Method, Operation: strings.ToLower(c.Operation)}
}

func (e *Engine) clock(c *Check) time.Time {
	if !c.Now.IsZero() {
		return c.Now
	}
	return e.now()
}

// counters returns a hash of the keys that items count on and of which of
// them are shadow rules: checks with the same hash count on the same
// state, alike. Keys hold no byte below 0x20 (they are escaped), so the
// separators keep apart keys that concatenate alike.
func counters(items []item) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037) // FNV-1a
	for i := range items {
		it := &items[i]
		for j := 0; j < len(it.key); j++ {
			h = (h ^ uint64(it.key[j])) * prime
		}
		sep := uint64(0)
		if it.shadow {
			sep = 1
		}
		h = (h ^ sep) * prime
	}
	return h
}

// plan appends to s.items the rules of p that apply to c, with their keys
// written into s.keys (see finishKeys).
func (e *Engine) plan(s *scratch, p *policy.Policy, c *Check, q *policy.Request, check int, prefix string) error {
	s.rules = p.Match(q, s.rules[:0])
	if len(s.rules) == 0 {
		return nil
	}
	now := e.clock(c)
	tier, asg := p.Lookup(q, now)
	cut := p.Throttle(q.ClientID, now)
	for _, r := range s.rules {
		l := r.LimitAt(tier, asg, now)
		if l == nil {
			if r.GlobalOnly() {
				if err := e.planGlobalOnly(s, r, q, c, check, prefix, cut, now); err != nil {
					return err
				}
			}
			continue
		}
		fromTier := l != r.Base
		if cut > 0 {
			// The cut limit counts on the keys of l (its tag is l's).
			l = p.Cut(l, cut)
		}
		keys, ok := r.AppendKey(s.keys, l, q)
		if !ok {
			s.keys = keys[:len(s.keys)]
			continue
		}
		s.keys = keys
		cost, err := ruleCost(r, q, c, prefix)
		if err != nil {
			return err
		}
		it := item{check: check, rule: r, limit: l, mode: r.FailureMode, shadow: r.Shadow, cost: cost, throttle: cut}
		it.params = &l.Params[c.Priority]
		if r.FailureMode == policy.FailLocal {
			it.local = &l.Local[c.Priority]
		}
		if fromTier {
			it.tier = tier
		}
		s.items = append(s.items, it)
		s.ends = append(s.ends, len(s.keys))
		e.planGlobal(s, r, q, &it, now)
	}
	return nil
}

// ruleCost returns the cost r charges for the check c, or the error of a
// cost too large; prefix prefixes the field's name.
func ruleCost(r *policy.Rule, q *policy.Request, c *Check, prefix string) (int64, error) {
	cost, ok := r.Cost(q.Operation, c.Cost)
	if !ok || cost > sluice.MaxLimit {
		return 0, &FieldError{Field: prefix + "cost", Reason: "too large after the cost multiplier of rule " + r.ID}
	}
	return cost, nil
}

// finishKeys turns the key bytes into strings with one allocation. In a
// batch of many checks, a key that repeats the one before (checks of one
// client under a one-rule policy) is kept once.
func (e *Engine) finishKeys(s *scratch) {
	if len(s.items) > repeatedKeysFrom {
		keepRepeatedKeysOnce(s)
	}
	all := string(s.keys)
	start := 0
	for i := range s.items {
		if s.ends[i] < 0 {
			s.items[i].key = s.items[i-1].key
			continue
		}
		s.items[i].key = all[start:s.ends[i]]
		start = s.ends[i]
	}
	e.resolveGlobal(s)
}

// repeatedKeysFrom is the number of items above which finishKeys looks
// for repeated keys; a single check's few are not worth the look.
const repeatedKeysFrom = 16

// keepRepeatedKeysOnce moves down in s.keys each key that differs from the
// one before, and sets s.ends[i] to -1 for each that does not.
func keepRepeatedKeysOnce(s *scratch) {
	start, w, prev := 0, 0, 0 // prev: where the last key kept starts
	for i := range s.items {
		k := s.keys[start:s.ends[i]]
		start = s.ends[i]
		if i > 0 && string(s.keys[prev:w]) == string(k) {
			s.ends[i] = -1
			continue
		}
		prev = w
		w += copy(s.keys[w:], k)
		s.ends[i] = w
	}
	s.keys = s.keys[:w]
}
