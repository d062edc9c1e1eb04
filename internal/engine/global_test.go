package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
)

const globalFile = `
version: 1
rules:
  - { id: api, match: { resource: "/api/*" }, dimension: client, limit: 100, window: 1m, global_limit: 5 }
`

// view is a GlobalView whose other regions are fixed by the test.
type view struct {
	mu       sync.Mutex
	seen     int64
	reserve  int64
	observed map[string]int64 // key@start -> count
	windows  map[int64]time.Duration
}

func (v *view) Allowance(key string, start int64, length time.Duration, limit int64) int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return limit - v.seen - v.reserve
}

func (v *view) Observe(key string, start int64, length time.Duration, count int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.observed == nil {
		v.observed, v.windows = map[string]int64{}, map[int64]time.Duration{}
	}
	v.observed[key] = max(v.observed[key], count)
	v.windows[start] = length
}

func newGlobalEngine(t *testing.T, v GlobalView, src ...string) *Engine {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(append(src, globalFile)[0]))
	if err != nil {
		t.Fatal(err)
	}
	st, err := memory.New(memory.Config{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Store: st, Policy: p, Now: func() time.Time { return t0 }, Global: v})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Alone (no view), a global limit holds in this region as any limit does.
func TestGlobalLimitAlone(t *testing.T) {
	e := newGlobalEngine(t, nil)
	for i := range 6 {
		r := mustCheck(t, e, Check{ClientID: "c", Resource: "/api/x", Cost: 1})
		g, ok := r.GlobalRemaining()
		if want := i < 5; r.Allowed != want || !ok || g != max(int64(4-i), 0) || len(r.Rules) != 2 {
			t.Fatalf("check %d: allowed %v, global remaining %d %v, %d rules; want %v, %d", i, r.Allowed, g, ok, len(r.Rules), want, max(4-i, 0))
		}
		if i == 5 && (!r.Deciding.Global || r.Deciding.Limit != 5) {
			t.Errorf("the denial's deciding rule: %+v, want the global limit of 5", r.Deciding)
		}
		if r.Rules[0].Global || r.Rules[0].Limit != 100 || r.Rules[0].Remaining != 100-int64(min(i+1, 5)) {
			t.Errorf("check %d: the regional result %+v", i, r.Rules[0])
		}
	}
}

// The other regions' counts and their reserve come off the limit; this
// region's counts are told to the view, in the window the store counted.
func TestGlobalLimitSharesWithOthers(t *testing.T) {
	v := &view{seen: 2, reserve: 1}
	e := newGlobalEngine(t, v)
	for i := range 3 {
		r := mustCheck(t, e, Check{ClientID: "c", Resource: "/api/x", Cost: 1})
		if want := i < 2; r.Allowed != want {
			t.Fatalf("check %d: allowed %v, want %v (5 less 2 seen and 1 reserved)", i, r.Allowed, want)
		}
	}
	if len(v.observed) != 1 {
		t.Fatalf("observed %v, want one key", v.observed)
	}
	for k, n := range v.observed {
		if n != 2 {
			t.Errorf("observed %s = %d, want 2", k, n)
		}
	}
	if l, ok := v.windows[t0.UnixMilli()]; !ok || l != time.Minute {
		t.Errorf("windows %v, want one minute from %d", v.windows, t0.UnixMilli())
	}
	// Another region's admissions seen: nothing is left.
	v.mu.Lock()
	v.seen = 3
	v.mu.Unlock()
	if r := mustCheck(t, e, Check{ClientID: "c", Resource: "/api/x", Cost: 1}); r.Allowed {
		t.Errorf("admitted with 2 here, 3 elsewhere and a global limit of 5")
	}
	// A region that took more than the limit leaves nothing, not less.
	v.mu.Lock()
	v.seen = 50
	v.mu.Unlock()
	r := mustCheck(t, e, Check{ClientID: "c", Resource: "/api/x", Cost: 1})
	if g, _ := r.GlobalRemaining(); r.Allowed || g != 0 || r.Rules[0].Remaining != 98 {
		t.Errorf("%+v", r)
	}
}

func TestGlobalLimitNeedsOwnLimit(t *testing.T) {
	for _, src := range []string{
		"version: 1\nrules:\n  - { id: a, limit: 5, window: 1m, global_limit: 0 }\n",
		"version: 1\nrules:\n  - { id: a, limit: 5, window: 1m, global_limit: -3 }\n",
		"version: 1\nrules:\n  - { id: a, limit: 5, window: 1m, global_limit: many }\n",
		"version: 1\nrules:\n  - { id: a, limit: 5, window: 1m, shadow: true, global_limit: 9 }\n",
		"version: 1\ntiers: { free: { limit: 5, window: 1m } }\nrules:\n  - { id: a, tiered: true, global_limit: 9 }\n",
	} {
		if _, err := policy.Parse("t.yaml", []byte(src)); err == nil {
			t.Errorf("%s: parsed", src)
		}
	}
}

// BenchmarkCheckGlobal: a check of a rule with a global limit (on, with a
// view of other regions), beside the same rule without one (off) and a
// rule with the global limit alone (only), for the cost of a global limit
// on the check path.
func BenchmarkCheckGlobal(b *testing.B) {
	for _, bc := range []struct {
		name, src string
		view      GlobalView
	}{
		{"off", "version: 1\nrules:\n  - { id: api, match: { resource: \"/api/*\" }, dimension: client, limit: 1000000000, window: 1m }\n", nil},
		{"on", "version: 1\nrules:\n  - { id: api, match: { resource: \"/api/*\" }, dimension: client, limit: 1000000000, window: 1m, global_limit: 1000000000 }\n", &view{}},
		{"only", "version: 1\nrules:\n  - { id: api, match: { resource: \"/api/*\" }, dimension: client, window: 1m, global_limit: 1000000000 }\n", &view{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p, err := policy.Parse("b.yaml", []byte(bc.src))
			if err != nil {
				b.Fatal(err)
			}
			st, err := memory.New(memory.Config{})
			if err != nil {
				b.Fatal(err)
			}
			e, err := New(Config{Store: st, Policy: p, Global: bc.view})
			if err != nil {
				b.Fatal(err)
			}
			c := &Check{ClientID: "bench", Resource: "/api/x", Cost: 1}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Check(context.Background(), c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
