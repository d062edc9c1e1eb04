package guard

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// TestOverLimitCacheAlone drives the over-limit cache without a guard or a
// store, at fixed instants: a denial with a retry-after denies, until then
// (less one quantum of the limit), requests on the key with the same
// params and at least the denied cost; a reset forgets it, and a denial
// decided by a call sent before the reset is not remembered.
func TestOverLimitCacheAlone(t *testing.T) {
	o, err := newOverLimitCache(OverLimitConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute})
	other := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 20, Window: time.Minute})
	t0 := time.Unix(1_700_000_000, 0)
	quantum := time.Duration(p.Quantum) * time.Microsecond
	o.remember(&store.Request{Key: "k", Params: p, Cost: 2}, t0, o.epoch.Load(),
		&sluice.Decision{Reason: sluice.ReasonLimited, Limit: 10, RetryAfter: 30 * time.Second, ResetAfter: 40 * time.Second})
	for _, c := range []struct {
		name      string
		key       string
		params    bool // p, or another limit
		cost      int64
		at        time.Duration
		want      bool
		wantRetry time.Duration
	}{
		{"same cost", "k", true, 2, 0, true, 30 * time.Second},
		{"larger cost, later", "k", true, 5, 10 * time.Second, true, 20 * time.Second},
		{"smaller cost", "k", true, 1, 0, false, 0},
		{"other params", "k", false, 2, 0, false, 0},
		{"other key", "j", true, 2, 0, false, 0},
		{"a quantum before the retry-after", "k", true, 2, 30*time.Second - quantum - time.Nanosecond, true, quantum + time.Nanosecond},
		{"from a quantum before the retry-after", "k", true, 2, 30*time.Second - quantum, false, 0},
	} {
		r := &store.Request{Key: c.key, Params: p, Cost: c.cost}
		if !c.params {
			r.Params = other
		}
		d, ok := o.lookup(r, t0.Add(c.at))
		if ok != c.want || ok && (d.Allowed || d.Reason != sluice.ReasonLimited || d.RetryAfter != c.wantRetry || d.Limit != 10) {
			t.Errorf("%s: lookup = %+v, %v; want denied %v with retry-after %s", c.name, d, ok, c.want, c.wantRetry)
		}
	}
	if !o.empty() {
		t.Error("an expired entry looked up stays in the cache")
	}

	deny := &sluice.Decision{Reason: sluice.ReasonLimited, Limit: 10, RetryAfter: time.Hour}
	o.remember(&store.Request{Key: "k", Params: p, Cost: 1}, t0, o.epoch.Load(), deny)
	o.reset([]string{"k"})
	if _, ok := o.lookup(&store.Request{Key: "k", Params: p, Cost: 1}, t0); ok {
		t.Error("denied after a reset")
	}
	before := o.epoch.Load() - 1
	o.remember(&store.Request{Key: "k", Params: p, Cost: 1}, t0, before, deny)
	if _, ok := o.lookup(&store.Request{Key: "k", Params: p, Cost: 1}, t0); ok {
		t.Error("remembered a denial sent before the reset")
	}
}
