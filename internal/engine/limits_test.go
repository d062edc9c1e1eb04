package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
)

// decideLimits decides items as one request of resolved limits, each on
// its own with each, and returns their outcomes.
func decideLimits(t *testing.T, e *Engine, each bool, items ...LimitItem) []LimitOutcome {
	t.Helper()
	l := Limits{Domain: "d", Each: each}
	ctx := e.StartLimits(context.Background(), &l, len(items))
	l.Items = append(l.Items, items...)
	err := e.DecideLimits(ctx, &l)
	out := make([]LimitOutcome, len(l.Items))
	for i := range l.Items {
		out[i] = l.Items[i].Outcome
	}
	e.EndLimits(ctx, &l, false, err)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDecideLimits: the items of a request of resolved limits are decided
// like the rules of a check: the enforcing ones all or nothing (or each on
// its own), the shadow and After ones after them, charged only when the
// enforcing ones all allowed.
func TestDecideLimits(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	one := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Minute})
	five := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Minute})
	item := func(key string, p *algorithm.Params) LimitItem {
		return LimitItem{Rule: key, Key: key, Params: p, Cost: 1, Mode: policy.FailOpen}
	}
	e, _ := newEngine(t, "")
	decideLimits(t, e, false, item("full", &one))
	// All or nothing: "full" refuses, "a" is not charged.
	out := decideLimits(t, e, false, item("a", &five), item("full", &one))
	if out[0].Over || out[0].Charged != 0 || out[0].Remaining != 5 || !out[1].Over || out[1].Source != SourceStore {
		t.Errorf("all or nothing: got %+v", out)
	}
	// Each on its own: "b" is charged.
	out = decideLimits(t, e, true, item("b", &five), item("full", &one))
	if out[0].Over || out[0].Charged != 1 || out[0].Remaining != 4 || !out[1].Over {
		t.Errorf("each on its own: got %+v", out)
	}
	// After: its being over charges the others; shadow: charged when they
	// all allow.
	after, shadow := item("full", &one), item("s", &five)
	after.After, shadow.Shadow = true, true
	out = decideLimits(t, e, false, item("c", &five), after, shadow)
	if out[0].Over || out[0].Charged != 1 || !out[1].Over || out[2].Over || out[2].Charged != 1 {
		t.Errorf("after and shadow: got %+v", out)
	}
	// A global limit alone.
	g := LimitItem{Rule: "g", Global: &one, GlobalKey: "g", Cost: 1}
	for i, want := range []bool{false, true} {
		if out := decideLimits(t, e, false, g); out[0].Over != want {
			t.Errorf("global alone, call %d: got %+v, want over %v", i+1, out[0], want)
		}
	}
	// Items that cannot be decided.
	for _, it := range []LimitItem{{Rule: "none", Key: "none", Cost: 1}, {Rule: "neg", Key: "neg", Params: &five, Cost: -1}} {
		var l Limits
		ctx := e.StartLimits(context.Background(), &l, 1)
		l.Items = append(l.Items, it)
		err := e.DecideLimits(ctx, &l)
		e.EndLimits(ctx, &l, false, err)
		if !errors.Is(err, ErrInvalidCheck) {
			t.Errorf("%s: got %v, want an invalid check", it.Rule, err)
		}
	}
}
