package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
)

const globalOnlyFile = `
version: 1
rules:
  - { id: g, match: { resource: "/g" }, dimension: client, window: 1m, global_limit: 3 }
  - { id: both, match: { resource: "/b" }, dimension: client, limit: 10, window: 1m, global_limit: 3 }
`

// A rule with only a global limit is decided by it alone, on one key: one
// result, marked global, whose limit and remaining are the global ones,
// on every store; a rule with both limits keeps both.
func TestGlobalOnly(t *testing.T) {
	onStores(t, globalOnlyFile, func(t *testing.T, e *Engine) {
		for i := range 4 {
			r := mustCheck(t, e, Check{ClientID: "c", Resource: "/g", Cost: 1})
			want := i < 3
			if r.Allowed != want || len(r.Rules) != 1 {
				t.Fatalf("check %d: allowed %v with rules %+v, want %v with one rule", i, r.Allowed, r.Rules, want)
			}
			rr := r.Rules[0]
			if rr.Rule != "g" || !rr.Global || rr.Limit != 3 || rr.Remaining != max(int64(2-i), 0) || rr.Source != SourceStore {
				t.Errorf("check %d: %+v, want rule g, global, limit 3, %d remaining, from the store", i, rr, max(2-i, 0))
			}
			if g, ok := r.GlobalRemaining(); !ok || g != rr.Remaining || r.Deciding != rr && want {
				t.Errorf("check %d: global remaining %d %v, deciding %+v", i, g, ok, r.Deciding)
			}
			if !want && (!r.Deciding.Global || r.Deciding.RetryAfter <= 0) {
				t.Errorf("the denial's deciding rule %+v, want the global limit with a retry", r.Deciding)
			}
		}
		// Another client has its own global count.
		if r := mustCheck(t, e, Check{ClientID: "d", Resource: "/g", Cost: 1}); !r.Allowed || r.Rules[0].Remaining != 2 {
			t.Errorf("another client: %+v", r)
		}
		st, err := e.Status(context.Background(), &Check{ClientID: "c", Resource: "/g"})
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 1 || !st[0].Global || st[0].Limit != 3 || st[0].Remaining != 0 {
			t.Errorf("status %+v, want the global limit of 3 with none remaining", st)
		}
		r := mustCheck(t, e, Check{ClientID: "c", Resource: "/b", Cost: 1})
		if len(r.Rules) != 2 || r.Rules[0].Global || r.Rules[0].Limit != 10 || !r.Rules[1].Global {
			t.Errorf("a rule with both limits: %+v, want the regional result, then the global one", r.Rules)
		}
		st, err = e.Status(context.Background(), &Check{ClientID: "c", Resource: "/b"})
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 2 || st[0].Global || st[0].Remaining != 9 || !st[1].Global || st[1].Limit != 3 || st[1].Remaining != 2 {
			t.Errorf("status of a rule with both limits %+v", st)
		}
	})
}

// A global-only rule's check is one store request, as a regional rule's.
func TestGlobalOnlyOneRequest(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte(globalOnlyFile))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Store: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		resource string
		items    int
	}{{"/g", 1}, {"/b", 2}} {
		s := e.getScratch()
		c := Check{ClientID: "c", Resource: tc.resource, Cost: 1}
		q := request(&c)
		if err := e.plan(s, p, &c, &q, 0, ""); err != nil {
			t.Fatal(err)
		}
		e.finishKeys(s)
		if len(s.items) != tc.items || !strings.Contains(s.items[len(s.items)-1].key, ":@g:") {
			t.Errorf("%s: %d items, the last on %q; want %d, the last the global key", tc.resource, len(s.items), s.items[len(s.items)-1].key, tc.items)
		}
		e.putScratch(s)
	}
}

// The view's counts of the other regions come off a global-only rule's
// limit, a throttle cuts it, and a cost multiplier charges it.
func TestGlobalOnlySharedAndCut(t *testing.T) {
	v := &view{seen: 1}
	e := newGlobalEngine(t, v, globalOnlyFile)
	for i := range 3 {
		r := mustCheck(t, e, Check{ClientID: "c", Resource: "/g", Cost: 1})
		if want := i < 2; r.Allowed != want {
			t.Fatalf("check %d: allowed %v, want %v (3 less 1 seen elsewhere)", i, r.Allowed, want)
		}
	}
	if len(v.observed) != 1 {
		t.Errorf("observed %v, want the rule's global key", v.observed)
	}
	for _, n := range v.observed {
		if n != 2 {
			t.Errorf("observed count %d, want 2", n)
		}
	}
	e = newGlobalEngine(t, nil, globalOnlyFile)
	withLayer(t, e, &policy.Layer{Revision: 1, Throttles: []policy.LayerThrottle{
		{ID: "t", Scope: "client", Target: "c", Percent: 50}}})
	r := mustCheck(t, e, Check{ClientID: "c", Resource: "/g", Cost: 1})
	if !r.Allowed || r.Rules[0].Limit != 1 || r.ThrottlePercent != 50 {
		t.Errorf("throttled by half: %+v, want the global limit cut to 1", r)
	}
	if r := mustCheck(t, e, Check{ClientID: "c", Resource: "/g", Cost: 1}); r.Allowed {
		t.Errorf("a second check under the cut limit of 1 was admitted")
	}
	p, err := policy.Parse("t.yaml", []byte(globalOnlyFile))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.WithLayer(&policy.Layer{Revision: 2, Overrides: []policy.LayerOverride{
		{ID: "o", Kind: policy.DimClient, Value: "c", Limits: map[string]policy.LayerLimit{"g": {Limit: 9}}}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "only a global_limit") {
		t.Errorf("an override of a global-only rule: %v, want refused", err)
	}
}

// While the store cannot answer, a global-only rule's failure mode
// decides: the local mode (the default) from each instance's share of the
// global limit, fail_open and fail_closed as for any rule.
func TestGlobalOnlyFailureModes(t *testing.T) {
	e, st := newEngine(t, `
version: 1
rules:
  - { id: local, match: { resource: /local }, window: 1m, global_limit: 4, expected_instances: 2 }
  - { id: open, match: { resource: /open }, window: 1m, global_limit: 1, failure_mode: fail_open }
  - { id: closed, match: { resource: /closed }, window: 1m, global_limit: 1, failure_mode: fail_closed }
`)
	fs := &flakyStore{Store: st}
	fs.down.Store(true)
	e.store = fs
	for i, want := range []bool{true, true, false} {
		r := mustCheck(t, e, Check{ClientID: "f", Resource: "/local", Cost: 1})
		if r.Allowed != want || r.Source != SourceLocal || !r.Deciding.Global || r.Deciding.Limit != 2 {
			t.Errorf("local, check %d: allowed %v from %s, deciding %+v; want %v from this instance's share of 2", i, r.Allowed, r.Source, r.Deciding, want)
		}
	}
	for range 2 {
		if r := mustCheck(t, e, Check{ClientID: "f", Resource: "/open", Cost: 1}); !r.Allowed || r.Source != SourceFailOpen {
			t.Errorf("fail_open: %+v", r)
		}
	}
	if r := mustCheck(t, e, Check{ClientID: "f", Resource: "/closed", Cost: 1}); r.Allowed || !r.Unavailable {
		t.Errorf("fail_closed: %+v", r)
	}
}
