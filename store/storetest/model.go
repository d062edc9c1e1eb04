package storetest

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Model decides requests with the pure functions of package algorithm,
// keeping each key's state in a map: what every store must agree with. It
// is not safe for concurrent use.
type Model struct {
	states map[string]algorithm.State
	logs   map[string][]int64
}

// NewModel returns a model with no state.
func NewModel() *Model {
	return &Model{states: map[string]algorithm.State{}, logs: map[string][]int64{}}
}

// Decide decides r, which must have a non-zero Now, at Now + After.
func (m *Model) Decide(r store.Request) sluice.Decision {
	return m.decide(r, true)
}

// decide decides r; a refusal counted under CountRefused is kept only
// when counted is true (CheckAll keeps none).
func (m *Model) decide(r store.Request, counted bool) sluice.Decision {
	now := r.Now.UnixMicro() + max(r.After, 0).Microseconds()
	if r.Params.Algorithm == sluice.SlidingWindowLog {
		nl, d := algorithm.ApplyLog(r.Params, append([]int64(nil), m.logs[r.Key]...), now, r.Cost)
		if d.Allowed && r.Cost > 0 {
			m.logs[r.Key] = nl
		}
		return d
	}
	ns, d := algorithm.Apply(r.Params, m.states[r.Key], now, r.Cost)
	if d.Allowed || counted {
		m.states[r.Key] = ns
	}
	return d
}

// DecideAll decides reqs as store.CheckAll does: all consume, or none does;
// when none does, the requests that alone would have been admitted report
// their key as it stands, limited, with no retry.
func (m *Model) DecideAll(reqs []store.Request) []sluice.Decision {
	saved := m.clone()
	out := make([]sluice.Decision, len(reqs))
	all := true
	for i, r := range reqs {
		out[i] = m.decide(r, false)
		all = all && out[i].Allowed
	}
	if all {
		return out
	}
	*m = *saved
	for i, r := range reqs {
		if !out[i].Allowed {
			continue
		}
		peek := saved.clone()
		r.Cost = 0
		out[i] = peek.Decide(r)
		out[i].Allowed, out[i].Reason, out[i].RetryAfter = false, sluice.ReasonLimited, 0
	}
	return out
}

func (m *Model) clone() *Model {
	c := NewModel()
	for k, v := range m.states {
		c.states[k] = v
	}
	for k, v := range m.logs {
		c.logs[k] = append([]int64(nil), v...)
	}
	return c
}
